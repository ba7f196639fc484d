/* dcpxd-closer.c - closing descriptors on a thread of their own (see
 * dcpxd-closer.h). One thread and a queue under one mutex: a close that
 * hangs holds up only the closes behind it, each of them a descriptor
 * dcpxd keeps open meanwhile. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "dcpxd-closer.h"

static struct {
  pthread_mutex_t lock;
  pthread_cond_t more;    /* fds queued, or stop */
  pthread_cond_t drained; /* the queue and the thread's close are done */
  int *fds;               /* queued, closed from the end */
  size_t n, cap;
  bool running, stopping, busy;
  pthread_t thread;
} C = {.lock = PTHREAD_MUTEX_INITIALIZER,
       .more = PTHREAD_COND_INITIALIZER,
       .drained = PTHREAD_COND_INITIALIZER};

static void *closer_main(void *arg) {
  (void)arg;
  pthread_mutex_lock(&C.lock);
  for (;;) {
    while (!C.n && !C.stopping)
      pthread_cond_wait(&C.more, &C.lock);
    if (!C.n)
      break;
    const int fd = C.fds[--C.n];
    C.busy = true;
    pthread_mutex_unlock(&C.lock);
    close(fd);
    pthread_mutex_lock(&C.lock);
    C.busy = false;
    if (!C.n)
      pthread_cond_broadcast(&C.drained);
  }
  pthread_mutex_unlock(&C.lock);
  return NULL;
}

int dcpxd_closer_start(void) {
  sigset_t all, old;
  int r;

  /* Signals go to the loop thread (libuv's handlers): none here. */
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  r = pthread_create(&C.thread, NULL, closer_main, NULL);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (r != 0)
    return -r;
  pthread_mutex_lock(&C.lock);
  C.running = true;
  C.stopping = false;
  pthread_mutex_unlock(&C.lock);
  return 0;
}

void dcpxd_closer_close(int fd) {
  if (fd < 0)
    return;
  pthread_mutex_lock(&C.lock);
  if (C.running && C.n == C.cap) {
    const size_t cap = C.cap ? 2 * C.cap : 64;
    int *p = realloc(C.fds, cap * sizeof(*p));
    if (p)
      C.fds = p, C.cap = cap;
  }
  if (C.running && C.n < C.cap) {
    C.fds[C.n++] = fd;
    pthread_cond_signal(&C.more);
    pthread_mutex_unlock(&C.lock);
    return;
  }
  pthread_mutex_unlock(&C.lock);
  close(fd);
}

void dcpxd_closer_stop(int ms) {
  struct timespec until;

  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += ms / 1000;
  until.tv_nsec += (long)(ms % 1000) * 1000000L;
  if (until.tv_nsec >= 1000000000L)
    until.tv_sec++, until.tv_nsec -= 1000000000L;
  pthread_mutex_lock(&C.lock);
  if (!C.running) {
    pthread_mutex_unlock(&C.lock);
    return;
  }
  while ((C.n || C.busy) &&
         pthread_cond_timedwait(&C.drained, &C.lock, &until) == 0)
    ;
  const bool done = !C.n && !C.busy;
  C.stopping = true;
  C.running = false;
  pthread_cond_signal(&C.more);
  pthread_mutex_unlock(&C.lock);
  if (done)
    pthread_join(C.thread, NULL);
  else
    pthread_detach(C.thread); /* a close that hangs: exit ends it */
}
