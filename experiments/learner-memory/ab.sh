#!/bin/bash
# Alternating A/B of jemalloc's decay in the learner soak (same binary, MALLOC_CONF at run time).
cd /work/main/learner
bin=../target/release/deps/memory_soak-7b18ebae1f396fbb
export COMAS_BENCH_MODEL=$HOME/.cache/comas/models/smollm2-135m-instruct COMAS_BENCH_STEPS=6
for round in 1 2; do
  for conf in never 10s; do
    case $conf in never) mc=dirty_decay_ms:-1,muzzy_decay_ms:-1;; 10s) mc=dirty_decay_ms:10000,muzzy_decay_ms:0;; esac
    MALLOC_CONF=$mc /usr/bin/time -v $bin --bench > /tmp/soak/ab-$round-$conf.out 2> /tmp/soak/ab-$round-$conf.time
  done
done
