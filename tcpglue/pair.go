package tcpglue

import (
	"os"

	"golang.org/x/sys/unix"
)

// StreamPair returns a connected pair of AF_UNIX stream sockets: one end as a Socket
// (non-blocking when nonblock), the other as an *os.File (for net.FileConn). It carries a
// byte stream that a user-space layer translates on its way to a TCP socket (the TLS
// fallback of zc: crypto/tls between the pair and the peer). The Socket's TCP options
// and addresses fail on it (it is no TCP socket).
func StreamPair(nonblock bool) (*Socket, *os.File, error) {
	typ := unix.SOCK_STREAM | unix.SOCK_CLOEXEC
	if nonblock {
		typ |= unix.SOCK_NONBLOCK
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, typ, 0)
	if err != nil {
		return nil, nil, opErr("socketpair", -1, nil, os.NewSyscallError("socketpair", err))
	}
	return newSocket(fds[0], unix.AF_UNIX, nonblock), os.NewFile(uintptr(fds[1]), "streampair"), nil
}
