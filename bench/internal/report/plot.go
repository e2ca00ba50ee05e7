package report

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/zcnet/zcnet/bench/internal/harness"
)

// The figure: a title line, the panels in two columns, and one legend for all of them
// in a column of its own on the right (a mode has the same color and marker in every
// panel), so that no legend covers data.

// style gives each mode its color and marker: fixed ones for the modes zcbench knows
// (the same in every run and every panel), a cycle for others.
type style struct{ modes []string }

// known lists the modes zcbench knows, with their colors (net black as the baseline,
// the zc modes in warm colors, the C reference servers in blue).
var known = []struct {
	mode string
	rgb  uint32
}{
	{"net", 0x000000}, {"net-buf", 0x555555}, {"syscall", 0x9c755f}, {"syscall-buf", 0xc5b0d5}, {"netpoll", 0x2ca02c}, {"iperf3", 0x7f7f7f},
	{"zc", 0xd62728}, {"zc-copy", 0xff7f0e}, {"zc-copy-aa", 0xffbb78}, {"zc-busy", 0x8c564b}, {"zc-extra-p", 0xc49c94}, {"zc-sendzc", 0x9467bd}, {"zc-mmap", 0xe377c2},
	{"zc-hash", 0xbcbd22}, {"zc-cpu", 0x17becf}, {"zc-net", 0x1f77b4}, {"zc-net-ring", 0xaec7e8},
	{"c-uring", 0x393b79}, {"c-epoll", 0x6b6ecf}, // the C references: blues
}

func newStyle(rows []Row) *style {
	s := &style{}
	for _, r := range rows {
		if len(r.Reps) > 0 && !slices.Contains(s.modes, r.Mode) {
			s.modes = append(s.modes, r.Mode)
		}
	}
	return s
}

func (s *style) index(mode string) int { return slices.Index(s.modes, mode) }

// key is the mode's place among the known modes, or after them.
func (s *style) key(mode string) int {
	for i, k := range known {
		if k.mode == mode {
			return i
		}
	}
	return len(known) + s.index(mode)
}

func (s *style) color(mode string) color.Color {
	k := s.key(mode)
	if k < len(known) {
		c := known[k].rgb
		return color.RGBA{R: uint8(c >> 16), G: uint8(c >> 8), B: uint8(c), A: 255}
	}
	return plotutil.Color(k)
}

func (s *style) shape(mode string) draw.GlyphDrawer { return plotutil.Shape(s.key(mode)) }

// dodge is a mode's offset from its category's x position (-0.35..0.35 of the gap
// between categories), so that points and bars of different modes do not overlap.
func (s *style) dodge(mode string, width float64) float64 {
	return width*(float64(s.index(mode))+0.5)/float64(len(s.modes)) - width/2
}

// human prints a tick value compactly: 150, 2.5k, 1.2M.
func human(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 1e6:
		return trim(fmt.Sprintf("%.1f", v/1e6)) + "M"
	case a >= 1e4:
		return trim(fmt.Sprintf("%.1f", v/1e3)) + "k"
	case a >= 10 || a == 0:
		return fmt.Sprintf("%.0f", v)
	case a >= 1:
		return trim(fmt.Sprintf("%.1f", v))
	default:
		return trim(fmt.Sprintf("%.2f", v))
	}
}

func trim(s string) string {
	for len(s) > 1 && s[len(s)-1] == '0' && slices.Contains([]byte(s), '.') {
		s = s[:len(s)-1]
	}
	if s[len(s)-1] == '.' {
		s = s[:len(s)-1]
	}
	return s
}

// logTicks labels 1, 2 and 5 times each power of ten inside the range (every decade
// has labelled values, however narrow the range), with unlabelled minor ticks between.
type logTicks struct{}

func (logTicks) Ticks(lo, hi float64) []plot.Tick {
	if lo <= 0 || hi <= lo {
		return nil
	}
	var ts []plot.Tick
	for e := math.Floor(math.Log10(lo)); math.Pow(10, e) <= hi; e++ {
		p := math.Pow(10, e)
		for m := 1; m <= 9; m++ {
			v := float64(m) * p
			if v < lo || v > hi {
				continue
			}
			t := plot.Tick{Value: v}
			if m == 1 || m == 2 || m == 5 {
				t.Label = human(v)
			}
			ts = append(ts, t)
		}
	}
	if hi/lo < 10 { // less than a decade: label every tick
		for i := range ts {
			ts[i].Label = human(ts[i].Value)
		}
	}
	return ts
}

// linTicks labels about five evenly spaced round values (steps of 1, 2, 2.5 or 5
// times a power of ten), with an unlabelled minor tick between each two.
type linTicks struct{}

func (linTicks) Ticks(lo, hi float64) []plot.Tick {
	if !(hi > lo) {
		return nil
	}
	raw := (hi - lo) / 5
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := 10 * mag
	for _, m := range []float64{1, 2, 2.5, 5} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var ts []plot.Tick
	for i := math.Ceil(lo / step * 2); i*step/2 <= hi*(1+1e-9); i++ {
		v := i * step / 2
		t := plot.Tick{Value: v}
		if math.Mod(i, 2) == 0 {
			t.Label = human(v)
		}
		ts = append(ts, t)
	}
	return ts
}

type errPoints struct {
	plotter.XYs
	plotter.YErrors
}

// bulkPlot: one line per mode of a bulk figure against the write size, bars min–max.
func bulkPlot(rows []Row, st *style, f Figure, title, ylabel string) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "write size"
	p.Y.Label.Text = ylabel
	p.Y.Tick.Marker = linTicks{}
	var ticks []plot.Tick
	any := false
	for _, mode := range st.modes {
		var ep errPoints
		for _, r := range rows {
			if r.Scenario != harness.Bulk || r.Mode != mode || len(r.Reps) == 0 {
				continue
			}
			s := r.Sum(f)
			if s.N == 0 {
				continue
			}
			x := math.Log2(float64(r.Size))
			ep.XYs = append(ep.XYs, plotter.XY{X: x + st.dodge(mode, 0.5), Y: s.Median})
			ep.YErrors = append(ep.YErrors, struct{ Low, High float64 }{s.Median - s.Min, s.Max - s.Median})
			if !slices.ContainsFunc(ticks, func(t plot.Tick) bool { return t.Value == x }) {
				ticks = append(ticks, plot.Tick{Value: x, Label: SizeString(r.Size)})
			}
		}
		if len(ep.XYs) == 0 {
			continue
		}
		any = true
		l, pts, err := plotter.NewLinePoints(ep.XYs)
		if err != nil {
			return nil, err
		}
		l.Color, pts.Color, pts.Shape = st.color(mode), st.color(mode), st.shape(mode)
		eb, err := plotter.NewYErrorBars(ep)
		if err != nil {
			return nil, err
		}
		eb.Color = st.color(mode)
		p.Add(l, pts, eb)
	}
	if !any {
		return nil, nil
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	p.X.Min -= 0.5
	p.X.Max += 0.5
	p.Y.Min = 0
	p.Y.Max *= 1.05
	return p, nil
}

// category is one group of points of a category panel.
type category struct {
	label       string
	s           harness.Scenario
	size, conns int
	f           Figure
}

// categoryPlot: for each category, one point per mode (side by side), median with bars
// min–max; log scale when asked.
func categoryPlot(rows []Row, st *style, cats []category, title, ylabel string, logY bool) (*plot.Plot, error) {
	type pt struct {
		ci          int
		mode        string
		med, lo, hi float64
	}
	var pts []pt
	var used []category
	for _, c := range cats {
		n := 0
		for _, mode := range st.modes {
			r := Find(rows, c.s, mode, c.size, c.conns)
			if r == nil {
				continue
			}
			s := r.Sum(c.f)
			if s.N == 0 || (logY && s.Min <= 0) {
				continue
			}
			pts = append(pts, pt{len(used), mode, s.Median, s.Min, s.Max})
			n++
		}
		if n > 0 {
			used = append(used, c)
		}
	}
	if len(pts) == 0 {
		return nil, nil
	}
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = ylabel
	lo, hi := math.Inf(1), 0.0
	for _, mode := range st.modes {
		var ep errPoints
		for _, q := range pts {
			if q.mode != mode {
				continue
			}
			x := float64(q.ci) + st.dodge(mode, 0.7)
			ep.XYs = append(ep.XYs, plotter.XY{X: x, Y: q.med})
			ep.YErrors = append(ep.YErrors, struct{ Low, High float64 }{q.med - q.lo, q.hi - q.med})
			lo, hi = min(lo, q.lo), max(hi, q.hi)
		}
		if len(ep.XYs) == 0 {
			continue
		}
		sc, err := plotter.NewScatter(ep.XYs)
		if err != nil {
			return nil, err
		}
		sc.Color, sc.Shape, sc.Radius = st.color(mode), st.shape(mode), vg.Points(3.5)
		eb, err := plotter.NewYErrorBars(ep)
		if err != nil {
			return nil, err
		}
		eb.Color = st.color(mode)
		p.Add(sc, eb)
	}
	names := make([]string, len(used))
	for i, c := range used {
		names[i] = c.label
	}
	p.NominalX(names...)
	p.X.Min, p.X.Max = -0.5, float64(len(used))-0.5
	if logY {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = logTicks{}
		p.Y.Min, p.Y.Max = lo/1.4, hi*1.4
	} else {
		p.Y.Tick.Marker = linTicks{}
		p.Y.Min, p.Y.Max = 0, hi*1.1
	}
	return p, nil
}

// panels are the plots of a run, in order, leaving out those without data.
func panels(rows []Row, st *style) ([]*plot.Plot, error) {
	var ps []*plot.Plot
	add := func(p *plot.Plot, err error) error {
		if p != nil {
			ps = append(ps, p)
		}
		return err
	}
	mcConns := func() []category {
		var cs []category
		for _, r := range rows {
			if r.Scenario == harness.MultiCore && len(r.Reps) > 0 &&
				!slices.ContainsFunc(cs, func(c category) bool { return c.size == r.Size && c.conns == r.Conns }) {
				cs = append(cs, category{fmt.Sprintf("%d conns", r.Conns), harness.MultiCore, r.Size, r.Conns, MsgsPerS})
			}
		}
		return cs
	}
	idleConns := 0
	for _, r := range rows {
		if r.Scenario == harness.Idle {
			idleConns = r.Conns
		}
	}
	// the services (issue 20): the goals' measures
	var svcGB, svcRate, svcFan, svcKV, svcWrk []category
	for _, n := range RelayConns {
		svcGB = append(svcGB, category{fmt.Sprintf("relay ×%d", n), harness.Relay, ServiceFrame, n, SrvCPUPerGB})
		svcRate = append(svcRate, category{fmt.Sprintf("relay ×%d", n), harness.Relay, ServiceFrame, n, Gbps})
	}
	svcGB = append(svcGB, category{"relay-hc ×8", harness.RelayHalfClose, ServiceFrame, 8, SrvCPUPerGB})
	for _, n := range FileConns {
		svcGB = append(svcGB, category{fmt.Sprintf("files ×%d", n), harness.FileStream, ServiceFrame, n, SrvCPUPerGB})
		svcRate = append(svcRate, category{fmt.Sprintf("files ×%d", n), harness.FileStream, ServiceFrame, n, Gbps})
	}
	for _, size := range FanOutSizes {
		for _, n := range FanOutConns {
			svcFan = append(svcFan, category{fmt.Sprintf("%s ×%d", SizeString(size), n), harness.FanOut, size, n, SrvCPUPerMsg})
		}
	}
	for _, size := range KVSizes {
		name := "kv 16–64 B"
		if size != 64 {
			name = "kv mix"
		}
		svcKV = append(svcKV, category{name, harness.KV, size, KVConns, SrvCPUPerMsg})
	}
	svcKV = append(svcKV, category{fmt.Sprintf("mq ×%d", MQConns), harness.MultiQueue, 64, MQConns, SrvCPUPerMsg})
	for _, wc := range WrkCases() {
		svcWrk = append(svcWrk, category{fmt.Sprintf("%s ×%d", SizeString(wc.Size), wc.Conns), harness.HTTPWrk, wc.Size, wc.Conns, SrvCPUPerMsg})
	}
	steps := []func() error{
		func() error {
			return add(bulkPlot(rows, st, Gbps, "Bulk, one stream: throughput", "Gbit/s (median, bars min–max)"))
		},
		func() error {
			return add(bulkPlot(rows, st, CPUPerGB, "Bulk, one stream: CPU per GB", "CPU s/GB, sender + receiver"))
		},
		func() error {
			return add(categoryPlot(rows, st, []category{
				{"p50", harness.PingPong, 64, 1, P50}, {"p99", harness.PingPong, 64, 1, P99}, {"p99.9", harness.PingPong, 64, 1, P999},
			}, "Ping-pong 64 B, one connection: round trip", "µs (median, bars min–max, log)", true))
		},
		func() error {
			return add(categoryPlot(rows, st, []category{
				{"echo 64 B ×64", harness.Echo, 64, 64, MsgsPerS}, {"echo 1 KiB ×64", harness.Echo, 1 << 10, 64, MsgsPerS},
				{"stream 64 B", harness.Stream, 64, 1, MsgsPerS}, {"HTTP ×32", harness.HTTP, 64, 32, MsgsPerS},
			}, "Messages per second, one CPU each side", "msgs/s (median, bars min–max, log)", true))
		},
		func() error {
			// the figure goal 13 judges: the server's CPU per request against the C servers'
			return add(categoryPlot(rows, st, []category{
				{"echo 64 B ×64", harness.Echo, 64, 64, SrvCPUPerMsg}, {"echo 1 KiB ×64", harness.Echo, 1 << 10, 64, SrvCPUPerMsg},
			}, "Echo: server CPU per request (c-uring, c-epoll: the C limit)", "server CPU µs/msg (median, bars min–max)", false))
		},
		func() error {
			return add(categoryPlot(rows, st, mcConns(), "Multi-core echo 64 B: server on N CPUs, load on the others",
				"msgs/s (median, bars min–max)", false))
		},
		func() error {
			return add(categoryPlot(rows, st, []category{
				{"file send (io.Copy)", harness.FileSend, 64 << 10, 1, Gbps},
			}, "File send through net.Conn", "Gbit/s (median, bars min–max)", false))
		},
		func() error {
			return add(categoryPlot(rows, st, []category{
				{fmt.Sprintf("%d idle conns", idleConns), harness.Idle, 64, idleConns, func(r harness.Rep) float64 { return r.IdleBytesPerConn / 1024 }},
			}, "Server memory per idle connection", "KiB of RSS per connection", false))
		},
		func() error {
			return add(categoryPlot(rows, st, svcGB, "Services: server CPU per GB (goals 7, 9)",
				"server CPU s/GB (median, bars min–max)", false))
		},
		func() error {
			return add(categoryPlot(rows, st, svcRate, "Services: relay and file throughput (goals 7, 9)",
				"Gbit/s (median, bars min–max)", false))
		},
		func() error {
			return add(categoryPlot(rows, st, svcFan, "Services: fan-out 1 → N, server CPU per delivery (goal 8)",
				"µs per delivery (median, bars min–max, log)", true))
		},
		func() error {
			return add(categoryPlot(rows, st, svcKV, "Services: key-value and multi-queue, server CPU (goals 10, 11)",
				"µs per op / request (median, bars min–max, log)", true))
		},
		func() error {
			return add(categoryPlot(rows, st, svcWrk, "Services: HTTP under wrk, server CPU per request (goal 12)",
				"µs per request (median, bars min–max)", false))
		},
		func() error {
			var cs []category
			for _, size := range WrkSizes {
				cs = append(cs, category{fmt.Sprintf("https %s ×%d", SizeString(size), HTTPSConns), harness.HTTPSWrk, size, HTTPSConns, SrvCPUPerMsg})
			}
			return add(categoryPlot(rows, st, cs, "TLS: HTTPS under wrk, server CPU per request (goal 15)",
				"µs per request (median, bars min–max)", false))
		},
		func() error {
			var cs []category
			for _, n := range TLSFileConns {
				cs = append(cs, category{fmt.Sprintf("files-tls ×%d", n), harness.FilesTLS, ServiceFrame, n, SrvCPUPerGB})
			}
			cs = append(cs, category{fmt.Sprintf("relay-tls ×%d", TLSRelayConns), harness.RelayTLS, ServiceFrame, TLSRelayConns, SrvCPUPerGB})
			return add(categoryPlot(rows, st, cs, "TLS: file streaming and relay, server CPU per GB (goals 14, 16)",
				"server CPU s/GB (median, bars min–max)", false))
		},
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return nil, err
		}
	}
	return ps, nil
}

// WritePNG draws the panels (two columns) with one legend column on the right into a
// PNG file. title describes the run (machine, date).
func WritePNG(path string, rows []Row, title string) error {
	st := newStyle(rows)
	ps, err := panels(rows, st)
	if err != nil {
		return err
	}
	if len(ps) == 0 {
		return fmt.Errorf("no data to plot")
	}
	const (
		pw, ph  = 6.2 * vg.Inch, 3.8 * vg.Inch // one panel
		legendW = 1.5 * vg.Inch
		titleH  = 0.45 * vg.Inch
		cols    = 2
	)
	nrows := (len(ps) + cols - 1) / cols
	w, h := pw*cols+legendW, ph*vg.Length(nrows)+titleH
	img := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(100))
	dc := draw.New(img)
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())

	ts := text.Style{Color: color.Black, Font: font.From(plot.DefaultFont, 13), Handler: plot.DefaultTextHandler,
		XAlign: draw.XLeft, YAlign: draw.YTop}
	dc.FillText(ts, vg.Point{X: 0.2 * vg.Inch, Y: h - 0.12*vg.Inch}, "zcbench: "+title)

	grid := draw.Crop(dc, 0, -legendW, 0, -titleH)
	tiles := draw.Tiles{Rows: nrows, Cols: cols, PadX: vg.Millimeter * 6, PadY: vg.Millimeter * 6,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 3, PadLeft: vg.Millimeter * 3, PadRight: vg.Millimeter * 3}
	grid2 := make([][]*plot.Plot, nrows)
	for i := range grid2 {
		grid2[i] = make([]*plot.Plot, cols)
	}
	for i, p := range ps {
		grid2[i/cols][i%cols] = p
	}
	cs := plot.Align(grid2, tiles, grid)
	for i, p := range ps {
		p.Draw(cs[i/cols][i%cols])
	}

	leg := plot.NewLegend()
	leg.Top, leg.Left = true, true
	leg.TextStyle.Font = font.From(plot.DefaultFont, 12)
	for _, mode := range st.modes {
		l, pts, err := plotter.NewLinePoints(plotter.XYs{{X: 0, Y: 0}})
		if err != nil {
			return err
		}
		l.Color, pts.Color, pts.Shape = st.color(mode), st.color(mode), st.shape(mode)
		leg.Add(mode, l, pts)
	}
	legArea := draw.Crop(dc, w-legendW+4*vg.Millimeter, 0, 0, -titleH-4*vg.Millimeter)
	leg.Draw(legArea)

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
