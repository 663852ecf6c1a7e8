package proxy

const benchChildEnv = "RUNFLEET_PROXY_BENCH_CHILD"

func benchChildMain() int { return 2 }
