package bpf

// The compiled objects (*_bpfel.o) and their Go bindings (*_bpfel.go) are
// committed, so building this package needs no clang. Regenerate them with
// `make bpf` (or go generate, with clang, llvm-strip and libbpf-dev
// installed); `make bpf-check` verifies the committed files match.

//go:generate ./gen.sh
