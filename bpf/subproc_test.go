package bpf

const helperEnv = "ZCNET_BPF_TEST_HELPER"

func runHelper(mode string) int { return 2 }
