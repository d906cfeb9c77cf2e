# Session 11, call 1: the call session 10 prepared, run as it stands (fused commit GPU tests and step A/B,
# slice probe, README warm A/B of eager against lazy Pallas imports).
bash benchmarks/results/logs10/next_call.sh
