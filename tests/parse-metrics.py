#!/usr/bin/env python3
"""parse-metrics.py FORMAT FILE GROUP WORLD - parses `dcpxctl stats
--format=FORMAT` output (openmetrics or prometheus) with prometheus_client's
own parsers and checks what tests/check_metrics.c expects of it.
Exit 0: good; 1: bad; 77: prometheus_client is not installed (SKIP)."""
import sys

try:
    from prometheus_client.openmetrics.parser import (
        text_string_to_metric_families as parse_openmetrics)
    from prometheus_client.parser import (
        text_string_to_metric_families as parse_prometheus)
except ImportError:
    print("parse-metrics.py: no prometheus_client (python3-prometheus-client)")
    sys.exit(77)

fmt, path, group, world = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
text = open(path, encoding="utf-8").read()
parse = parse_openmetrics if fmt == "openmetrics" else parse_prometheus
fams = {f.name: f for f in parse(text)}  # raises ValueError if invalid

def fail(msg):
    print("parse-metrics.py: " + msg)
    print(text)
    sys.exit(1)

per_rank = {"dcpx_calls": "counter", "dcpx_rows": "counter",
            "dcpx_rescue_rows": "counter", "dcpx_failed_calls": "counter",
            "dcpx_timeouts": "counter", "dcpx_awaited_timeouts": "counter",
            "dcpx_rank_joined": "gauge",
            "dcpx_rank_alarm": "gauge", "dcpx_rank_failed": "gauge"}
per_group = {"dcpx_group_generation": "gauge",
             "dcpx_group_joined_ranks": "gauge",
             "dcpx_group_world_size": "gauge",
             "dcpx_group_aborted": "gauge", "dcpx_group_aborts": "counter",
             "dcpx_group_recoveries": "counter",
             "dcpx_group_wait_timeout_seconds": "gauge",
             "dcpx_group": "info"}
if fmt == "prometheus":  # families are named as their samples; no info type
    per_rank = {n + ("_total" if t == "counter" else ""): t
                for n, t in per_rank.items()}
    per_group = {n + ("_total" if t == "counter" else
                      "_info" if t == "info" else ""):
                 ("gauge" if t == "info" else t)
                 for n, t in per_group.items()}
    # prometheus_client's text parser strips _total from counter families
    fams = {(f.name + "_total" if f.type == "counter" else f.name): f
            for f in fams.values()}

for name, typ in list(per_rank.items()) + list(per_group.items()):
    f = fams.get(name)
    if f is None:
        fail("no family %s (have %s)" % (name, sorted(fams)))
    if f.type != typ:
        fail("%s is a %s, not a %s" % (name, f.type, typ))
    if not f.documentation:
        fail("%s has no HELP" % name)
    mine = [s for s in f.samples if s.labels.get("group") == group]
    want = world if name in per_rank else 1
    if len(mine) != want:
        fail("%s: %d samples of group %s, not %d" % (name, len(mine), group,
                                                     want))
    if name in per_rank:
        ranks = sorted(int(s.labels["rank"]) for s in mine)
        if ranks != list(range(world)):
            fail("%s: ranks %s" % (name, ranks))

def value(name, rank=None):
    for s in fams[name].samples:
        if s.labels.get("group") == group and (
                rank is None or s.labels.get("rank") == str(rank)):
            if s.name.endswith("_created"):
                continue
            return s.value
    fail("no sample %s rank %s" % (name, rank))

calls = "dcpx_calls" if fmt == "openmetrics" else "dcpx_calls_total"
rows = "dcpx_rows" if fmt == "openmetrics" else "dcpx_rows_total"
resc = "dcpx_rescue_rows" if fmt == "openmetrics" else "dcpx_rescue_rows_total"
for r in range(world):
    if value(calls, r) < 1 or value(rows, r) < 1 or value(resc, r) < 1:
        fail("rank %d: no calls, rows or rescued rows" % r)
    if value("dcpx_rank_joined", r) != 1:
        fail("rank %d not joined" % r)
if value("dcpx_group_joined_ranks") != world:
    fail("joined ranks")
if value("dcpx_group_world_size") != world:
    fail("world size")
if value("dcpx_group_generation") != 1:
    fail("generation")
if fmt == "openmetrics":
    info = [s for s in fams["dcpx_group"].samples
            if s.labels.get("group") == group][0]
    if info.name != "dcpx_group_info" or info.labels.get("state") != "ready":
        fail("dcpx_group_info: %s" % (info,))
    if not text.endswith("# EOF\n"):
        fail("no # EOF")
print("parse-metrics.py: %s: %d families parsed, good" % (fmt, len(fams)))
