package zcrx

import (
	"errors"
	"fmt"
	"os"

	"github.com/zcnet/zcnet/internal/errs"
	"github.com/zcnet/zcnet/internal/uring"
	"github.com/zcnet/zcnet/memreg"
)

// Capability is what this kernel offers zcrx, probed (not guessed from the version). Each
// field is nil when the feature is there, or an error matching ErrNotSupported that says
// what it needs. Whether a NIC queue can be bound is only known by binding it (New).
type Capability struct {
	RecvZC error // IORING_OP_RECV_ZC and zcrx registration (Linux 6.15+)
	NoDev  error // device-less instances (ZCRX_REG_NODEV, Linux 7.1+)
	Share  error // export/import across rings (ZCRX_CTRL_EXPORT, ZCRX_REG_IMPORT)
	Stats  error // the kernel's copy counters (ZCRX_FEATURE_EVENT)
	Dmabuf error // dmabuf-backed areas: /dev/udmabuf (CONFIG_UDMABUF)
	Query  uring.ZcrxQuery
}

func (c Capability) String() string {
	yes := func(err error) string {
		if err == nil {
			return "yes"
		}
		return "no (" + err.Error() + ")"
	}
	return fmt.Sprintf("RECV_ZC %s; device-less %s; share %s; copy stats %s; dmabuf areas %s",
		yes(c.RecvZC), yes(c.NoDev), yes(c.Share), yes(c.Stats), yes(c.Dmabuf))
}

// Probe reports what this kernel offers.
func Probe() Capability {
	var c Capability
	caps := uring.DetectCapabilities()
	c.RecvZC = caps.NeedOp(uring.OpRecvZC, "RECV_ZC (zcrx)", "6.15")
	if c.RecvZC == nil && (!caps.SetupOK(uring.SetupCQE32) || !caps.SetupOK(uring.SetupSingleIssuer|uring.SetupDeferTaskrun)) {
		c.RecvZC = errs.NotSupported("zcrx", "io_uring rings with CQE32 and DEFER_TASKRUN", nil)
	}
	q, err := uring.QueryZcrx()
	c.Query = q
	var ns *errs.NotSupportedError
	if errors.As(err, &ns) && ns.Err != nil {
		err = ns.Err // the query's own errno says enough
	}
	switch {
	case err != nil:
		c.NoDev = errs.NotSupported("device-less zcrx (ZCRX_REG_NODEV)", "Linux 7.1 or newer", err)
		c.Share = errs.NotSupported("zcrx export/import", "Linux 7.0 or newer", err)
		c.Stats = errs.NotSupported("zcrx copy statistics", "Linux 7.2 or newer", err)
	default:
		if q.RegisterFlags&uring.ZcrxRegNodev == 0 {
			c.NoDev = errs.NotSupported("device-less zcrx (ZCRX_REG_NODEV)", "Linux 7.1 or newer", nil)
		}
		if q.RegisterFlags&uring.ZcrxRegImport == 0 || q.NrCtrlOpcodes < 2 {
			c.Share = errs.NotSupported("zcrx export/import", "Linux 7.0 or newer", nil)
		}
		if q.Features&uring.ZcrxFeatureEvent == 0 {
			c.Stats = errs.NotSupported("zcrx copy statistics", "Linux 7.2 or newer", nil)
		}
	}
	if c.RecvZC != nil {
		c.NoDev, c.Share, c.Stats = c.RecvZC, c.RecvZC, c.RecvZC
	}
	if _, err := os.Stat(memreg.UdmabufDevice); err != nil {
		c.Dmabuf = errs.NotSupported("dmabuf areas (udmabuf)", memreg.UdmabufDevice+": a kernel with CONFIG_UDMABUF=y", err)
	}
	return c
}
