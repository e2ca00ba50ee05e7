package uring

import (
	"bytes"
	"errors"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/testutil"
)

func TestZcrxLayout(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"io_uring_zcrx_offsets", unsafe.Sizeof(zcrxOffsets{}), 32},
		{"io_uring_zcrx_area_reg", unsafe.Sizeof(zcrxAreaReg{}), 48},
		{"io_uring_zcrx_ifq_reg", unsafe.Sizeof(zcrxIfqReg{}), 96},
		{"io_uring_region_desc", unsafe.Sizeof(regionDesc{}), 64},
		{"io_uring_zcrx_rqe", unsafe.Sizeof(ZcrxRqe{}), 16},
		{"zcrx_event_desc", unsafe.Sizeof(zcrxEventDesc{}), 96},
		{"zcrx_ctrl", unsafe.Sizeof(zcrxCtrl{}), 72},
		{"io_uring_query_hdr", unsafe.Sizeof(queryHdr{}), 40},
		{"io_uring_query_zcrx", unsafe.Sizeof(ZcrxQuery{}), 40},
		{"zcrx_stats", unsafe.Sizeof(ZcrxStats{}), 16},
		{"cqe32", unsafe.Sizeof(CQE32{}), 32},
		{"ifq_reg.offsets", unsafe.Offsetof(zcrxIfqReg{}.Offsets), 32},
		{"ifq_reg.zcrx_id", unsafe.Offsetof(zcrxIfqReg{}.ZcrxID), 64},
		{"ifq_reg.event_desc", unsafe.Offsetof(zcrxIfqReg{}.EventDesc), 72},
	} {
		if c.got != c.want {
			t.Errorf("%s: %d, want %d", c.name, c.got, c.want)
		}
	}
}

// uapi73Include is where `make uapi73` unpacks the 7.3 linux-libc-dev headers (ZCNET_UAPI73
// overrides it).
func uapi73Include() string {
	if d := os.Getenv("ZCNET_UAPI73"); d != "" {
		return d
	}
	return filepath.Join("..", "..", "build", "uapi73", "usr", "include")
}

// TestZcrxLayoutAgainst73Header compiles a C program against Linux 7.3's
// <linux/io_uring.h> (which includes io_uring/zcrx.h and io_uring/query.h) and compares every
// zcrx size, offset and constant with the Go side. `make test` fetches the header first
// (make uapi73); without it (no gcc, no header) the test skips and says why.
func TestZcrxLayoutAgainst73Header(t *testing.T) {
	inc := uapi73Include()
	if _, err := os.Stat(filepath.Join(inc, "linux", "io_uring", "zcrx.h")); err != nil {
		t.Skipf("no Linux 7.3 uapi headers at %s (run make uapi73): %v", inc, err)
	}
	var ifq zcrxIfqReg
	var area zcrxAreaReg
	var ev zcrxEventDesc
	var ctrl zcrxCtrl
	var qh queryHdr
	var qz ZcrxQuery
	checks := map[string]uint64{
		"sizeof(struct io_uring_zcrx_rqe)":                       uint64(unsafe.Sizeof(ZcrxRqe{})),
		"sizeof(struct io_uring_zcrx_cqe)":                       16,
		"sizeof(struct io_uring_zcrx_offsets)":                   uint64(unsafe.Sizeof(zcrxOffsets{})),
		"offsetof(struct io_uring_zcrx_offsets, rqes)":           uint64(unsafe.Offsetof(zcrxOffsets{}.Rqes)),
		"sizeof(struct io_uring_zcrx_area_reg)":                  uint64(unsafe.Sizeof(area)),
		"offsetof(struct io_uring_zcrx_area_reg, rq_area_token)": uint64(unsafe.Offsetof(area.RqAreaToken)),
		"offsetof(struct io_uring_zcrx_area_reg, flags)":         uint64(unsafe.Offsetof(area.Flags)),
		"offsetof(struct io_uring_zcrx_area_reg, dmabuf_fd)":     uint64(unsafe.Offsetof(area.DmabufFd)),
		"sizeof(struct io_uring_zcrx_ifq_reg)":                   uint64(unsafe.Sizeof(ifq)),
		"offsetof(struct io_uring_zcrx_ifq_reg, rq_entries)":     uint64(unsafe.Offsetof(ifq.RqEntries)),
		"offsetof(struct io_uring_zcrx_ifq_reg, flags)":          uint64(unsafe.Offsetof(ifq.Flags)),
		"offsetof(struct io_uring_zcrx_ifq_reg, area_ptr)":       uint64(unsafe.Offsetof(ifq.AreaPtr)),
		"offsetof(struct io_uring_zcrx_ifq_reg, region_ptr)":     uint64(unsafe.Offsetof(ifq.RegionPtr)),
		"offsetof(struct io_uring_zcrx_ifq_reg, offsets)":        uint64(unsafe.Offsetof(ifq.Offsets)),
		"offsetof(struct io_uring_zcrx_ifq_reg, zcrx_id)":        uint64(unsafe.Offsetof(ifq.ZcrxID)),
		"offsetof(struct io_uring_zcrx_ifq_reg, rx_buf_len)":     uint64(unsafe.Offsetof(ifq.RxBufLen)),
		"offsetof(struct io_uring_zcrx_ifq_reg, event_desc)":     uint64(unsafe.Offsetof(ifq.EventDesc)),
		"sizeof(struct io_uring_region_desc)":                    uint64(unsafe.Sizeof(regionDesc{})),
		"offsetof(struct io_uring_region_desc, flags)":           uint64(unsafe.Offsetof(regionDesc{}.Flags)),
		"offsetof(struct io_uring_region_desc, mmap_offset)":     uint64(unsafe.Offsetof(regionDesc{}.MmapOffset)),
		"sizeof(struct zcrx_event_desc)":                         uint64(unsafe.Sizeof(ev)),
		"offsetof(struct zcrx_event_desc, type_mask)":            uint64(unsafe.Offsetof(ev.TypeMask)),
		"offsetof(struct zcrx_event_desc, flags)":                uint64(unsafe.Offsetof(ev.Flags)),
		"offsetof(struct zcrx_event_desc, stats_offset)":         uint64(unsafe.Offsetof(ev.StatsOffset)),
		"sizeof(struct zcrx_stats)":                              uint64(unsafe.Sizeof(ZcrxStats{})),
		"offsetof(struct zcrx_stats, copy_bytes)":                uint64(unsafe.Offsetof(ZcrxStats{}.CopyBytes)),
		"sizeof(struct zcrx_ctrl)":                               uint64(unsafe.Sizeof(ctrl)),
		"offsetof(struct zcrx_ctrl, op)":                         uint64(unsafe.Offsetof(ctrl.Op)),
		"offsetof(struct zcrx_ctrl, zc_export)":                  uint64(unsafe.Offsetof(ctrl.Arg)),
		"offsetof(struct zcrx_ctrl, zc_export.zcrx_fd)":          uint64(unsafe.Offsetof(ctrl.Arg)),
		"offsetof(struct zcrx_ctrl, zc_area.area_ptr)":           uint64(unsafe.Offsetof(ctrl.Arg)),
		"sizeof(((struct zcrx_ctrl *)0)->zc_flush)":              uint64(unsafe.Sizeof(ctrl.Arg)),
		"sizeof(struct io_uring_query_hdr)":                      uint64(unsafe.Sizeof(qh)),
		"offsetof(struct io_uring_query_hdr, query_op)":          uint64(unsafe.Offsetof(qh.QueryOp)),
		"offsetof(struct io_uring_query_hdr, size)":              uint64(unsafe.Offsetof(qh.Size)),
		"offsetof(struct io_uring_query_hdr, result)":            uint64(unsafe.Offsetof(qh.Result)),
		"sizeof(struct io_uring_query_zcrx)":                     uint64(unsafe.Sizeof(qz)),
		"offsetof(struct io_uring_query_zcrx, nr_ctrl_opcodes)":  uint64(unsafe.Offsetof(qz.NrCtrlOpcodes)),
		"offsetof(struct io_uring_query_zcrx, features)":         uint64(unsafe.Offsetof(qz.Features)),
		"offsetof(struct io_uring_query_zcrx, rq_hdr_size)":      uint64(unsafe.Offsetof(qz.RqHdrSize)),
		"offsetof(struct io_uring_query_zcrx, rq_hdr_alignment)": uint64(unsafe.Offsetof(qz.RqHdrAlignment)),
		"IORING_ZCRX_AREA_SHIFT":                                 ZcrxAreaShift,
		"IORING_ZCRX_AREA_MASK":                                  ZcrxAreaMask,
		"IORING_ZCRX_AREA_DMABUF":                                ZcrxAreaDmabuf,
		"ZCRX_REG_IMPORT":                                        ZcrxRegImport,
		"ZCRX_REG_NODEV":                                         ZcrxRegNodev,
		"ZCRX_FEATURE_RX_PAGE_SIZE":                              ZcrxFeatureRxPageSize,
		"ZCRX_FEATURE_EVENT":                                     ZcrxFeatureEvent,
		"ZCRX_EVENT_ALLOC_FAIL":                                  ZcrxEventAllocFail,
		"ZCRX_EVENT_COPY":                                        ZcrxEventCopy,
		"ZCRX_EVENT_DESC_FLAG_STATS":                             zcrxEventDescFlagStats,
		"ZCRX_CTRL_FLUSH_RQ":                                     zcrxCtrlFlushRQ,
		"ZCRX_CTRL_EXPORT":                                       zcrxCtrlExport,
		"ZCRX_CTRL_ARM_EVENT":                                    zcrxCtrlArmEvent,
		"ZCRX_CTRL_ADD_AREA":                                     zcrxCtrlAddArea,
		"IO_URING_QUERY_ZCRX":                                    queryOpZcrx,
		"IORING_MEM_REGION_TYPE_USER":                            memRegionTypeUser,
		"IORING_REGISTER_ZCRX_IFQ":                               RegisterZcrxIfq,
		"IORING_REGISTER_QUERY":                                  RegisterQuery,
		"IORING_REGISTER_ZCRX_CTRL":                              RegisterZcrxCtrl,
		"IORING_REGISTER_MEM_REGION":                             RegisterMemRegion,
		"IORING_REGISTER_RESIZE_RINGS":                           RegisterResizeRings,
		"IORING_OP_RECV_ZC":                                      OpRecvZC,
		"IORING_SETUP_CQE_MIXED":                                 SetupCQEMixed,
		"IORING_SETUP_SQE_MIXED":                                 SetupSQEMixed,
		"IORING_CQE_F_SKIP":                                      CQEFSkip,
		"IORING_CQE_F_32":                                        CQEF32,
		"offsetof(struct io_uring_sqe, zcrx_ifq_idx)":            uint64(unsafe.Offsetof(SQE{}.FileIndex)),
	}
	arch := filepath.Join(inc, runtime.GOARCH+"-linux-gnu")
	if runtime.GOARCH == "amd64" {
		arch = filepath.Join(inc, "x86_64-linux-gnu")
	}
	testutil.CompareWithC(t, []string{"linux/io_uring.h", "linux/io_uring/query.h"}, []string{"-I", inc, "-I", arch}, checks)
}

func zcrxRing(t testing.TB, entries uint32) *Ring {
	t.Helper()
	return newRing(t, entries, &Options{Flags: SetupSingleIssuer | SetupDeferTaskrun | SetupCQE32 | SetupSubmitAll})
}

// TestZcrxRefusal: this machine has no NIC that can do zero-copy receive. Binding a queue of
// lo must fail with a typed refusal naming what it needs and leak nothing; the other bad
// inputs fail with their errno.
func TestZcrxRefusal(t *testing.T) {
	testutil.RequireFeature(t, DetectCapabilities().Probe.Supports(OpRecvZC), "IORING_OP_RECV_ZC", "6.15")
	testutil.RequireRoot(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r := zcrxRing(t, 8)
	area := mmapBuf(t, 1<<20)
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	plain := newRing(t, 8, nil)
	before := countFDs()
	_, err = r.RegisterZcrx(ZcrxConfig{IfIndex: uint32(lo.Index), RqEntries: 64, Area: UserArea(area)})
	var ze *ZcrxError
	if !errors.As(err, &ze) || !errors.Is(err, unix.EOPNOTSUPP) || !errors.Is(err, ErrNotSupported) {
		t.Fatalf("zcrx on lo = %v, want *ZcrxError matching EOPNOTSUPP and ErrNotSupported", err)
	}
	if !strings.Contains(err.Error(), "needs a NIC driver with zcrx support (mlx5, gve, fbnic, bnxt)") {
		t.Fatalf("refusal does not say what it needs: %v", err)
	}
	t.Logf("lo: %v", err)
	for _, c := range []struct {
		name string
		ring *Ring
		cfg  ZcrxConfig
		want error
	}{
		{"bogus ifindex", r, ZcrxConfig{IfIndex: 1 << 30, RqEntries: 64, Area: UserArea(area)}, unix.ENODEV},
		{"ring without CQE32", plain, ZcrxConfig{IfIndex: uint32(lo.Index), RqEntries: 64, Area: UserArea(area)}, unix.EINVAL},
		{"unaligned area", r, ZcrxConfig{IfIndex: uint32(lo.Index), RqEntries: 64, Area: UserArea(area[1:4097])}, unix.EINVAL},
		{"empty area", r, ZcrxConfig{IfIndex: uint32(lo.Index), RqEntries: 64}, unix.EINVAL},
		{"refill ring of 3", r, ZcrxConfig{IfIndex: uint32(lo.Index), RqEntries: 3, Area: UserArea(area)}, unix.EINVAL},
		{"refill ring too large", r, ZcrxConfig{IfIndex: uint32(lo.Index), RqEntries: 1 << 16, Area: UserArea(area)}, unix.EINVAL},
		{"device-less with an ifindex", r, ZcrxConfig{NoDev: true, IfIndex: uint32(lo.Index), RqEntries: 64, Area: UserArea(area)}, unix.EINVAL},
		{"dmabuf area of no pages", r, ZcrxConfig{IfIndex: uint32(lo.Index), RqEntries: 64, Area: DmabufArea(7, 100)}, unix.EINVAL},
	} {
		z, err := c.ring.RegisterZcrx(c.cfg)
		if !errors.Is(err, c.want) || !errors.As(err, &ze) {
			t.Errorf("%s: %v, want a *ZcrxError matching %v", c.name, err, c.want)
		}
		if z != nil {
			z.Close()
		}
	}
	if n := openZcrx.Load(); n != 0 {
		t.Fatalf("%d zcrx objects left", n)
	}
	if after := countFDs(); after != before {
		t.Fatalf("fds: %d before, %d after", before, after)
	}
}

// TestZcrxNoDevRefusedBefore71: a device-less instance on a kernel without ZCRX_REG_NODEV is
// refused as not supported, naming the kernel it needs; on 7.1+ it registers.
func TestZcrxNoDevProbe(t *testing.T) {
	testutil.RequireRoot(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r := zcrxRing(t, 8)
	z, err := r.RegisterZcrx(ZcrxConfig{NoDev: true, RqEntries: 64, Area: UserArea(mmapBuf(t, 64<<10))})
	if err != nil && !strings.Contains(err.Error(), "Linux 7.1") {
		t.Errorf("refusal does not name the kernel it needs: %v", err)
	}
	testutil.SkipIfNotSupported(t, err, "7.1")
	defer z.Close()
	if z.RxBufLen() != uint32(os.Getpagesize()) {
		t.Errorf("rx buffer length %d, want the page size", z.RxBufLen())
	}
	q, err := QueryZcrx()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("query: %+v", q)
}

func countFDs() int {
	e, _ := os.ReadDir("/proc/self/fd")
	return len(e)
}

// zcrxRecv drives a RECV_ZC on one ring and collects what arrives.
type zcrxRecv struct {
	t     testing.TB
	r     *Ring
	z     *Zcrx
	area  []byte
	fd    int32
	got   []byte
	cqes  []CQE32
	held  []ZcrxRqe
	final *CQE32
}

func (x *zcrxRecv) arm(ud uint64) {
	sqe := x.r.GetSQE()
	sqe.PrepRecvZC(x.fd, x.z.ID(), 0)
	sqe.UserData = ud
	mustSubmit(x.t, x.r)
}

// reap takes the ready completions: data CQEs are copied out of the area and their buffers
// kept in held (refilled by the caller); a CQE without F_MORE ends the request.
func (x *zcrxRecv) reap(wait time.Duration) int {
	x.t.Helper()
	if _, err := x.r.SubmitAndWaitTimeout(1, wait); err != nil && !errors.Is(err, unix.ETIME) && !errors.Is(err, unix.EINTR) {
		x.t.Fatal(err)
	}
	n := x.r.PeekBatch32(x.cqes)
	for i := 0; i < n; i++ {
		c := x.cqes[i]
		if c.Res > 0 {
			off := c.ZcrxOffset()
			if off&ZcrxAreaMask != x.z.AreaToken() {
				x.t.Fatalf("CQE offset %#x names area %#x, want %#x", off, off&ZcrxAreaMask, x.z.AreaToken())
			}
			o := off &^ ZcrxAreaMask
			if o+uint64(c.Res) > uint64(len(x.area)) {
				x.t.Fatalf("CQE [%d, +%d) outside the area of %d", o, c.Res, len(x.area))
			}
			x.got = append(x.got, x.area[o:o+uint64(c.Res)]...)
			x.held = append(x.held, ZcrxRqe{Off: off, Len: uint32(c.Res)})
		}
		if !c.More() {
			cc := c
			x.final = &cc
		}
	}
	return n
}

func (x *zcrxRecv) refillAll() {
	x.t.Helper()
	for len(x.held) > 0 {
		k := x.z.Refill(x.held)
		x.held = x.held[k:]
		if err := x.z.FlushRQ(); err != nil {
			x.t.Fatal(err)
		}
	}
}

// TestZcrxNoDevLoopback runs the device-less data path (Linux 7.1+, the 7.3 VM of make
// vmtest) at the ring level: 4 MiB over loopback TCP through a 256 KiB area, every byte
// checked, buffers refilled through the refill ring and FLUSH_RQ; then the area runs dry
// while buffers are held (the request ends: re-arm after refilling, no byte lost); EOF.
func TestZcrxNoDevLoopback(t *testing.T) {
	testutil.RequireRoot(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r := zcrxRing(t, 64)
	area := mmapBuf(t, 256<<10)
	z, err := r.RegisterZcrx(ZcrxConfig{NoDev: true, RqEntries: 128, Area: UserArea(area), Stats: true})
	if errors.Is(err, ErrNotSupported) && strings.Contains(err.Error(), "7.2") {
		z, err = r.RegisterZcrx(ZcrxConfig{NoDev: true, RqEntries: 128, Area: UserArea(area)})
	}
	testutil.SkipIfNotSupported(t, err, "7.1")
	defer z.Close()
	cfd, sfd := tcpPair(t)
	payload := make([]byte, 4<<20)
	fill(payload, 11)
	sendErr := make(chan error, 1)
	go func() {
		for off := 0; off < len(payload); {
			n, err := unix.Write(cfd, payload[off:min(off+64<<10, len(payload))])
			if err != nil {
				sendErr <- err
				return
			}
			off += n
		}
		sendErr <- unix.Shutdown(cfd, unix.SHUT_WR)
	}()
	x := &zcrxRecv{t: t, r: r, z: z, area: area, fd: int32(sfd), cqes: make([]CQE32, 256)}
	x.arm(1)
	rearms := 0
	deadline := time.Now().Add(60 * time.Second)
	for len(x.got) < len(payload) || x.final == nil || x.final.Res != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("stuck at %d of %d bytes (final %+v)", len(x.got), len(payload), x.final)
		}
		x.reap(100 * time.Millisecond)
		x.refillAll()
		if x.final != nil && (x.final.Res != 0 || len(x.got) < len(payload)) {
			if x.final.Res < 0 && unix.Errno(-x.final.Res) != unix.ENOMEM && unix.Errno(-x.final.Res) != unix.ENOSPC {
				t.Fatalf("RECV_ZC ended with %v after %d bytes", unix.Errno(-x.final.Res), len(x.got))
			}
			rearms++
			x.final = nil
			x.arm(1)
		}
	}
	if err := <-sendErr; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(x.got, payload) {
		t.Fatalf("received bytes differ from the sent ones (%d bytes)", len(x.got))
	}
	if st, ok := z.Stats(); ok {
		t.Logf("kernel copy stats: %+v", st)
	}
	t.Logf("4 MiB through 256 KiB: %d refills, %d re-arms", z.Refills(), rearms)
}

// TestZcrxNoDevExhaustion: with every area buffer held by the application, the request ends
// with ENOMEM (area exhausted) and nothing is lost: after the refills a new request receives
// the rest.
func TestZcrxNoDevExhaustion(t *testing.T) {
	testutil.RequireRoot(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r := zcrxRing(t, 64)
	area := mmapBuf(t, 16*4096)
	z, err := r.RegisterZcrx(ZcrxConfig{NoDev: true, RqEntries: 64, Area: UserArea(area)})
	testutil.SkipIfNotSupported(t, err, "7.1")
	defer z.Close()
	cfd, sfd := tcpPair(t)
	payload := make([]byte, 256<<10)
	fill(payload, 5)
	go func() {
		testutil.WriteAll(cfd, payload)
		unix.Shutdown(cfd, unix.SHUT_WR)
	}()
	x := &zcrxRecv{t: t, r: r, z: z, area: area, fd: int32(sfd), cqes: make([]CQE32, 256)}
	x.arm(1)
	for x.final == nil {
		x.reap(time.Second)
	}
	if pages := len(area) / os.Getpagesize(); x.final.Res != -int32(unix.ENOMEM) || len(x.held) != pages {
		t.Fatalf("area of %d pages exhausted: ended with %d after %d completions, want ENOMEM after %d", pages, x.final.Res, len(x.held), pages)
	}
	exhausted := 0
	deadline := time.Now().Add(30 * time.Second)
	for x.final == nil || x.final.Res != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("stuck at %d bytes", len(x.got))
		}
		if x.final != nil {
			exhausted++
			x.final = nil
			x.refillAll()
			x.arm(2)
		}
		x.reap(100 * time.Millisecond)
	}
	if !bytes.Equal(x.got, payload) {
		t.Fatalf("bytes differ after %d exhaustions", exhausted)
	}
	t.Logf("%d exhaustions", exhausted)
}

// TestZcrxExportImport: an instance exported from one ring and imported into another
// receives there into the same area; the refill ring is shared; closing the exporting ring
// first leaves the import working.
func TestZcrxExportImport(t *testing.T) {
	testutil.RequireRoot(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r1 := zcrxRing(t, 64)
	area := mmapBuf(t, 64*4096)
	z1, err := r1.RegisterZcrx(ZcrxConfig{NoDev: true, RqEntries: 64, Area: UserArea(area)})
	testutil.SkipIfNotSupported(t, err, "7.1")
	fd, err := z1.Export()
	if err != nil {
		t.Fatal(err)
	}
	r2, err := New(64, &Options{Flags: SetupSingleIssuer | SetupDeferTaskrun | SetupCQE32})
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	z2, err := r2.ImportZcrx(fd, z1)
	unix.Close(fd)
	if err != nil {
		t.Fatal(err)
	}
	defer z2.Close()
	if _, err := r2.ImportZcrx(fd, z1); !errors.Is(err, unix.EBADF) {
		t.Errorf("import of a closed fd: %v, want EBADF", err)
	}
	// The exporting ring goes away first.
	z1.Close()
	r1.Close()
	cfd, sfd := tcpPair(t)
	payload := make([]byte, 1<<20)
	fill(payload, 9)
	go func() {
		testutil.WriteAll(cfd, payload)
		unix.Shutdown(cfd, unix.SHUT_WR)
	}()
	x := &zcrxRecv{t: t, r: r2, z: z2, area: area, fd: int32(sfd), cqes: make([]CQE32, 256)}
	x.arm(1)
	deadline := time.Now().Add(30 * time.Second)
	for x.final == nil || x.final.Res != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("stuck at %d bytes", len(x.got))
		}
		x.reap(100 * time.Millisecond)
		x.refillAll()
		if x.final != nil && x.final.Res != 0 {
			x.final = nil
			x.arm(1)
		}
	}
	if !bytes.Equal(x.got, payload) {
		t.Fatal("bytes received through the import differ")
	}
}
