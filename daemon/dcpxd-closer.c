/* dcpxd-closer.c - closing descriptors on threads of their own (see
 * dcpxd-closer.h). Two closers, each a thread and a queue under one
 * mutex: one for the fds clients send, one for dcpxd's own buffers. A
 * close that hangs (a client's FUSE file) holds up only the closes
 * behind it on its closer, each a descriptor dcpxd keeps open meanwhile;
 * dcpxd's own memory is freed all the same. */
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

typedef struct {
  pthread_mutex_t lock;
  pthread_cond_t more;    /* fds queued, or stop */
  pthread_cond_t drained; /* the queue and the thread's close are done */
  int *fds;               /* queued, closed from the end */
  size_t n, cap;
  bool running, stopping, busy;
  pthread_t thread;
} closer;

#define CLOSER_INIT                                                            \
  {                                                                            \
    .lock = PTHREAD_MUTEX_INITIALIZER, .more = PTHREAD_COND_INITIALIZER,       \
    .drained = PTHREAD_COND_INITIALIZER                                        \
  }

static closer Clients = CLOSER_INIT, Own = CLOSER_INIT;

static void *closer_main(void *arg) {
  closer *c = arg;
  pthread_mutex_lock(&c->lock);
  for (;;) {
    while (!c->n && !c->stopping)
      pthread_cond_wait(&c->more, &c->lock);
    if (!c->n)
      break;
    const int fd = c->fds[--c->n];
    c->busy = true;
    pthread_mutex_unlock(&c->lock);
    close(fd);
    pthread_mutex_lock(&c->lock);
    c->busy = false;
    if (!c->n)
      pthread_cond_broadcast(&c->drained);
  }
  pthread_mutex_unlock(&c->lock);
  return NULL;
}

static int closer_start(closer *c) {
  sigset_t all, old;
  int r;

  pthread_mutex_lock(&c->lock);
  c->running = true; /* before the thread: it must not see a stop */
  c->stopping = false;
  pthread_mutex_unlock(&c->lock);
  /* Signals go to the loop thread (libuv's handlers): none here. */
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  r = pthread_create(&c->thread, NULL, closer_main, c);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (r != 0) {
    pthread_mutex_lock(&c->lock);
    c->running = false;
    pthread_mutex_unlock(&c->lock);
    return -r;
  }
  return 0;
}

int dcpxd_closer_start(void) {
  int r = closer_start(&Clients);
  if (r == 0 && (r = closer_start(&Own)) < 0)
    dcpxd_closer_stop(0);
  return r;
}

static void closer_close(closer *c, int fd) {
  if (fd < 0)
    return;
  pthread_mutex_lock(&c->lock);
  if (c->running && c->n == c->cap) {
    const size_t cap = c->cap ? 2 * c->cap : 64;
    int *p = realloc(c->fds, cap * sizeof(*p));
    if (p)
      c->fds = p, c->cap = cap;
  }
  if (c->running && c->n < c->cap) {
    c->fds[c->n++] = fd;
    pthread_cond_signal(&c->more);
    pthread_mutex_unlock(&c->lock);
    return;
  }
  pthread_mutex_unlock(&c->lock);
  close(fd);
}

void dcpxd_closer_close(int fd) { closer_close(&Clients, fd); }

void dcpxd_closer_close_own(int fd) { closer_close(&Own, fd); }

size_t dcpxd_closer_backlog(void) {
  pthread_mutex_lock(&Clients.lock);
  const size_t n = Clients.n + (Clients.busy ? 1u : 0u);
  pthread_mutex_unlock(&Clients.lock);
  return n;
}

static void closer_stop(closer *c, const struct timespec *until) {
  pthread_mutex_lock(&c->lock);
  if (!c->running) {
    pthread_mutex_unlock(&c->lock);
    return;
  }
  while ((c->n || c->busy) &&
         pthread_cond_timedwait(&c->drained, &c->lock, until) == 0)
    ;
  const bool done = !c->n && !c->busy;
  c->stopping = true;
  c->running = false;
  pthread_cond_signal(&c->more);
  pthread_mutex_unlock(&c->lock);
  if (done)
    pthread_join(c->thread, NULL);
  else
    pthread_detach(c->thread); /* a close that hangs: left to it */
}

void dcpxd_closer_stop(int ms) {
  struct timespec until;

  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += ms / 1000;
  until.tv_nsec += (long)(ms % 1000) * 1000000L;
  if (until.tv_nsec >= 1000000000L)
    until.tv_sec++, until.tv_nsec -= 1000000000L;
  closer_stop(&Own, &until);
  closer_stop(&Clients, &until);
}
