package ztls

import "github.com/zcnet/zcnet/internal/ktls"

// KernelStats returns the kernel's TLS counters (/proc/net/tls_stat, Linux 5.7: TlsCurrTxSw,
// TlsTxSw, TlsRxSw, TlsDecryptError, TlsRxRekeyOk (6.14), ...), for this process's network
// namespace. A kernel without TLS has no such file: the error matches ErrNotSupported.
func KernelStats() (map[string]uint64, error) { return ktls.KernelStats() }

// parseTLSStat reads "Name value" lines; anything else is skipped.
func parseTLSStat(b []byte) map[string]uint64 { return ktls.ParseTLSStat(b) }
