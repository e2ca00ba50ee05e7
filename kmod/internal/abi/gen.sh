#!/bin/sh
# Regenerates zabi_linux.go from kmod/uapi/zcshim.h (run by go generate).
set -e
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
{
	printf '//go:build amd64 || arm64\n\n'
	go tool cgo -objdir "$dir" -godefs -- -I../../uapi types_zcshim.go
} | gofmt > zabi_linux.go
