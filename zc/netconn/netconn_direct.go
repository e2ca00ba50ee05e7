package netconn

import (
	"io"
)

// writeToDirect is WriteTo on a direct connection: Read into one buffer, write it to w.
func (n *netConn) writeToDirect(w io.Writer) (int64, error) {
	buf := make([]byte, 64<<10)
	var total int64
	for {
		k, err := n.Read(buf)
		if k > 0 {
			wk, werr := w.Write(buf[:k])
			total += int64(wk)
			if werr != nil {
				return total, werr
			}
			if wk < k {
				return total, io.ErrShortWrite
			}
		}
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}
