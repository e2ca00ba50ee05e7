// Package abi is the Go side of the /dev/zcshim ABI, generated from the C
// header kmod/uapi/zcshim.h (the single source of truth) by
// `go tool cgo -godefs`. Regenerate with `go generate ./kmod/internal/abi`
// after editing the header; TestGeneratedUpToDate fails when they drift and
// TestLayout compares every size and offset against gcc's view of the header.
package abi

//go:generate sh gen.sh
