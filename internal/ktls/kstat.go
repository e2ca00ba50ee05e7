package ktls

import (
	"bufio"
	"bytes"
	"errors"
	"io/fs"
	"os"
	"strconv"

	"github.com/zcnet/zcnet/internal/errs"
)

// KernelStats returns the kernel's TLS counters (/proc/net/tls_stat, Linux 5.7: TlsCurrTxSw,
// TlsTxSw, TlsRxSw, TlsDecryptError, TlsRxRekeyOk (6.14), ...), for the calling thread's
// network namespace. A kernel without TLS has no such file: the error matches
// errs.ErrNotSupported.
func KernelStats() (map[string]uint64, error) {
	b, err := os.ReadFile("/proc/net/tls_stat")
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errs.NotSupported("kernel TLS counters (/proc/net/tls_stat)", "the tls module, Linux 5.7 or newer", err)
	}
	if err != nil {
		return nil, err
	}
	return ParseTLSStat(b), nil
}

// ParseTLSStat reads "Name value" lines; anything else is skipped.
func ParseTLSStat(b []byte) map[string]uint64 {
	m := map[string]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) != 2 {
			continue
		}
		if v, err := strconv.ParseUint(string(f[1]), 10, 64); err == nil {
			m[string(f[0])] = v
		}
	}
	return m
}
