package tcpglue

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestTCPInfoLive(t *testing.T) {
	c, s := pair(t, "tcp4", "127.0.0.1:0", ListenOptions{}, DialOptions{})
	const n = 1 << 20
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 64<<10)
		total := 0
		for total < n {
			m, err := s.Read(buf)
			if err != nil {
				done <- err
				return
			}
			total += m
		}
		done <- nil
	}()
	if _, err := c.Write(make([]byte, n)); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ci, err := c.TCPInfo()
	if err != nil {
		t.Fatal(err)
	}
	si, err := s.TCPInfo()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kernel returned %d bytes of tcp_info; client: state %v rtt %v cwnd %d mss %d sent %d acked %d delivery %d B/s",
		ci.Len, ci.State, ci.RTT, ci.SndCwnd, ci.SndMSS, ci.BytesSent, ci.BytesAcked, ci.DeliveryRate)
	if ci.Len < 104 {
		t.Fatalf("tcp_info length %d", ci.Len)
	}
	if ci.State != StateEstablished || si.State != StateEstablished {
		t.Errorf("states %v/%v", ci.State, si.State)
	}
	if !ci.Valid("RTT") || ci.Valid("Len") || ci.Valid("NoSuchField") {
		t.Error("Valid answers wrong")
	}
	if ci.Valid("BytesSent") {
		if ci.BytesSent < n {
			t.Errorf("BytesSent %d < %d", ci.BytesSent, n)
		}
	}
	if ci.Valid("BytesAcked") && ci.BytesAcked < n {
		// Every byte was read by the peer, so it was acknowledged (+1 for the SYN).
		t.Errorf("BytesAcked %d < %d", ci.BytesAcked, n)
	}
	if si.BytesReceived != n {
		t.Errorf("server BytesReceived %d, want %d", si.BytesReceived, n)
	}
	if ci.SndCwnd == 0 || ci.SndMSS == 0 || ci.RTT <= 0 || ci.MinRTT <= 0 {
		t.Errorf("implausible client info %+v", ci)
	}
	if ci.Options&OptTimestamps == 0 {
		t.Errorf("timestamps not negotiated on loopback: options %#x", ci.Options)
	}
	// Listening sockets have tcp_info too.
	ln, err := Listen("tcp4", "127.0.0.1:0", ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	li, err := ln.TCPInfo()
	if err != nil {
		t.Fatal(err)
	}
	if li.State != StateListen {
		t.Errorf("listener state %v", li.State)
	}
}

func TestParseTCPInfoShort(t *testing.T) {
	full := make([]byte, tcpInfoMax)
	for i := range full {
		full[i] = byte(i)
	}
	info := ParseTCPInfo(full[:104]) // Linux 3.x-era length: up to tcpi_total_retrans
	if !info.Valid("TotalRetrans") || info.Valid("PacingRate") {
		t.Errorf("valid fields wrong for 104 bytes: %v", info.ValidFields())
	}
	if info.PacingRate != 0 {
		t.Error("field beyond Len decoded")
	}
	if want := binary.NativeEndian.Uint32(full[100:]); info.TotalRetrans != want {
		t.Errorf("TotalRetrans %#x want %#x", info.TotalRetrans, want)
	}
	if info := ParseTCPInfo(nil); info.Len != 0 || len(info.ValidFields()) != 0 {
		t.Error("empty input")
	}
	long := append(full, make([]byte, 100)...)
	if info := ParseTCPInfo(long); len(info.ValidFields()) != len(infoFields) {
		t.Error("long input should have every field valid")
	}
}

// TestTCPInfoMatchesXSys checks the field table against the struct in
// golang.org/x/sys/unix (generated from newer kernel headers than the
// system's): same offsets and sizes for every field there.
func TestTCPInfoMatchesXSys(t *testing.T) {
	typ := reflect.TypeOf(unix.TCPInfo{})
	byName := map[string]reflect.StructField{}
	for i := 0; i < typ.NumField(); i++ {
		f := typ.Field(i)
		byName[strings.ToLower(f.Name)] = f
	}
	for _, f := range infoFields {
		if f.bits {
			continue
		}
		xf, ok := byName[strings.TrimPrefix(f.c, "tcpi_")]
		if !ok {
			t.Errorf("%s: not in unix.TCPInfo", f.c)
			continue
		}
		if int(xf.Offset) != f.off || int(xf.Type.Size()) != f.size {
			t.Errorf("%s: table off %d size %d, x/sys off %d size %d", f.c, f.off, f.size, xf.Offset, xf.Type.Size())
		}
	}
	if int(typ.Size()) != tcpInfoMax {
		t.Errorf("unix.TCPInfo size %d, tcpInfoMax %d", typ.Size(), tcpInfoMax)
	}
}

// TestTCPInfoLayoutC compiles a C program against the system's <linux/tcp.h>
// and compares offsetof/sizeof of every member it has with the table, and the
// bitfield encoding of bytes 6 and 7. Fields newer than the installed header
// are skipped (TestTCPInfoMatchesXSys covers them).
func TestTCPInfoLayoutC(t *testing.T) {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not installed")
	}
	hdr, err := os.ReadFile("/usr/include/linux/tcp.h")
	if err != nil {
		t.Skip("no /usr/include/linux/tcp.h (install linux-libc-dev)")
	}
	start := bytes.Index(hdr, []byte("struct tcp_info {"))
	if start < 0 {
		t.Fatal("struct tcp_info not found in linux/tcp.h")
	}
	end := bytes.Index(hdr[start:], []byte("};"))
	body := string(hdr[start : start+end])
	var src strings.Builder
	src.WriteString("#include <stdio.h>\n#include <stddef.h>\n#include <string.h>\n#include <linux/tcp.h>\n")
	src.WriteString("int main(void) {\n")
	checked := 0
	for _, f := range infoFields {
		if f.bits || !regexp.MustCompile(`\b`+f.c+`\b`).MatchString(body) {
			continue
		}
		fmt.Fprintf(&src, "  printf(\"%s %%zu %%zu\\n\", offsetof(struct tcp_info, %s), sizeof(((struct tcp_info *)0)->%s));\n", f.c, f.c, f.c)
		checked++
	}
	src.WriteString(`  struct tcp_info ti; unsigned char *b = (unsigned char *)&ti;
  memset(&ti, 0, sizeof ti);
  ti.tcpi_snd_wscale = 5; ti.tcpi_rcv_wscale = 9;
  ti.tcpi_delivery_rate_app_limited = 1; ti.tcpi_fastopen_client_fail = 2;
  printf("bits %u %u\n", b[6], b[7]);
  printf("size %zu\n", sizeof ti);
  return 0;
}
`)
	dir := t.TempDir()
	cfile := filepath.Join(dir, "ti.c")
	bin := filepath.Join(dir, "ti")
	if err := os.WriteFile(cfile, []byte(src.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(gcc, "-O0", "-o", bin, cfile).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s\n%s", err, out, src.String())
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	table := map[string]infoField{}
	for _, f := range infoFields {
		table[f.c] = f
	}
	seen := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		switch fs[0] {
		case "bits":
			b6, _ := strconv.Atoi(fs[1])
			b7, _ := strconv.Atoi(fs[2])
			b := make([]byte, tcpInfoMax)
			b[6], b[7] = byte(b6), byte(b7)
			info := ParseTCPInfo(b)
			if info.SndWScale != 5 || info.RcvWScale != 9 || !info.DeliveryRateAppLimited || info.FastOpenClientFail != 2 {
				t.Errorf("bitfields from C bytes %#x %#x decode as snd %d rcv %d app %v tfo %d",
					b6, b7, info.SndWScale, info.RcvWScale, info.DeliveryRateAppLimited, info.FastOpenClientFail)
			}
		case "size":
			t.Logf("installed header: sizeof(struct tcp_info) = %s; %d table fields checked", fs[1], checked)
		default:
			off, _ := strconv.Atoi(fs[1])
			size, _ := strconv.Atoi(fs[2])
			f := table[fs[0]]
			if f.off != off || f.size != size {
				t.Errorf("%s: table off %d size %d, C off %d size %d", fs[0], f.off, f.size, off, size)
			}
			seen++
		}
	}
	if seen != checked || checked < 50 {
		t.Errorf("checked %d fields, C printed %d", checked, seen)
	}
}

func FuzzParseTCPInfo(f *testing.F) {
	f.Add([]byte{})
	f.Add(make([]byte, 104))
	f.Add(make([]byte, tcpInfoMax))
	f.Add(bytes.Repeat([]byte{0xff}, tcpInfoMax+17))
	f.Fuzz(func(t *testing.T, b []byte) {
		info := ParseTCPInfo(b)
		if info.Len != len(b) {
			t.Fatalf("Len %d != %d", info.Len, len(b))
		}
		for _, name := range info.ValidFields() {
			if !info.Valid(name) {
				t.Fatalf("%s listed valid but Valid says no", name)
			}
		}
		if len(b) >= 1 && info.State != TCPState(b[0]) {
			t.Fatal("state")
		}
		_ = info.State.String() + info.CAState.String()
		if len(b) >= 8 {
			if info.SndWScale > 15 || info.RcvWScale > 15 || info.FastOpenClientFail > 3 {
				t.Fatal("bitfield out of range")
			}
		}
		// Decoding a prefix never changes fields valid in it.
		if len(b) > 0 {
			short := ParseTCPInfo(b[:len(b)/2])
			if short.Valid("RTT") && short.RTT != info.RTT {
				t.Fatal("prefix decode differs")
			}
		}
	})
}
