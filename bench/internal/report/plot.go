package report

import (
	"fmt"
	"math"
	"os"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/zcnet/zcnet/bench/internal/harness"
)

// modesOf lists the modes of the rows of one scenario, in first-seen order.
func modesOf(rows []Row, s harness.Scenario) []string {
	var ms []string
	for _, r := range rows {
		if r.Scenario == s && len(r.Reps) > 0 && !slices.Contains(ms, r.Mode) {
			ms = append(ms, r.Mode)
		}
	}
	return ms
}

type errPoints struct {
	plotter.XYs
	plotter.YErrors
}

// throughputPlot: bulk Gbit/s against write size, one line per mode, bars from min
// to max.
func throughputPlot(rows []Row, title string) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "Bulk throughput, one stream — " + title
	p.X.Label.Text = "write size"
	p.Y.Label.Text = "Gbit/s (median, bars min–max)"
	p.Legend.Top = true
	p.Legend.Left = true
	var ticks []plot.Tick
	for i, mode := range modesOf(rows, harness.Bulk) {
		var ep errPoints
		for _, r := range rows {
			if r.Scenario != harness.Bulk || r.Mode != mode || len(r.Reps) == 0 {
				continue
			}
			s := r.Sum(Gbps)
			if s.N == 0 {
				continue
			}
			x := math.Log2(float64(r.Size))
			ep.XYs = append(ep.XYs, plotter.XY{X: x, Y: s.Median})
			ep.YErrors = append(ep.YErrors, struct{ Low, High float64 }{s.Median - s.Min, s.Max - s.Median})
			if !slices.ContainsFunc(ticks, func(t plot.Tick) bool { return t.Value == x }) {
				ticks = append(ticks, plot.Tick{Value: x, Label: SizeString(r.Size)})
			}
		}
		if len(ep.XYs) == 0 {
			continue
		}
		l, pts, err := plotter.NewLinePoints(ep.XYs)
		if err != nil {
			return nil, err
		}
		l.Color = plotutil.Color(i)
		pts.Color = plotutil.Color(i)
		pts.Shape = plotutil.Shape(i)
		eb, err := plotter.NewYErrorBars(ep)
		if err != nil {
			return nil, err
		}
		eb.Color = plotutil.Color(i)
		p.Add(l, pts, eb)
		p.Legend.Add(mode, l, pts)
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	p.X.Min -= 0.5
	p.X.Max += 0.5
	p.Y.Min = 0
	p.Y.Max *= 1.2 // room for the legend
	return p, nil
}

func latencyPlot(rows []Row, _ string) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "Ping-pong 64 B, one connection: round-trip latency"
	p.Y.Label.Text = "µs (median of repetitions, log scale)"
	p.X.Label.Text = "percentile"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top = true
	p.Legend.Left = true
	figs := []Figure{P50, P99, P999}
	lo, hi := math.Inf(1), 0.0
	for i, mode := range modesOf(rows, harness.PingPong) {
		r := Find(rows, harness.PingPong, mode, 64, 1)
		if r == nil {
			continue
		}
		var xys plotter.XYs
		for c, f := range figs {
			v := r.Sum(f).Median
			if v > 0 && !math.IsNaN(v) {
				xys = append(xys, plotter.XY{X: float64(c), Y: v})
				lo, hi = min(lo, v), max(hi, v)
			}
		}
		if len(xys) == 0 {
			continue
		}
		l, pts, err := plotter.NewLinePoints(xys)
		if err != nil {
			return nil, err
		}
		l.Color, pts.Color, pts.Shape = plotutil.Color(i), plotutil.Color(i), plotutil.Shape(i)
		p.Add(l, pts)
		p.Legend.Add(mode, l, pts)
	}
	if hi == 0 {
		return nil, nil
	}
	p.NominalX("p50", "p99", "p99.9")
	p.Y.Min, p.Y.Max = lo/1.5, hi*1.5
	return p, nil
}

func messagesPlot(rows []Row, _ string) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "Messages per second (echo: 64 connections, one request in flight each)"
	p.Y.Label.Text = "msgs/s (median, bars min–max, log scale)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top = true
	p.Legend.Left = true
	type cat struct {
		s           harness.Scenario
		size, conns int
	}
	var cats []cat
	var names, modes []string
	for _, r := range rows {
		if (r.Scenario != harness.Echo && r.Scenario != harness.Stream) || len(r.Reps) == 0 {
			continue
		}
		c := cat{r.Scenario, r.Size, r.Conns}
		if !slices.Contains(cats, c) {
			cats = append(cats, c)
			n := "stream " + SizeString(r.Size)
			if r.Scenario == harness.Echo {
				n = fmt.Sprintf("echo %s", SizeString(r.Size))
			}
			names = append(names, n)
		}
		if !slices.Contains(modes, r.Mode) {
			modes = append(modes, r.Mode)
		}
	}
	if len(cats) == 0 {
		return nil, nil
	}
	lo, hi := math.Inf(1), 0.0
	for i, mode := range modes {
		var ep errPoints
		for ci, c := range cats {
			r := Find(rows, c.s, mode, c.size, c.conns)
			if r == nil {
				continue
			}
			s := r.Sum(MsgsPerS)
			if s.N == 0 || s.Min <= 0 {
				continue
			}
			x := float64(ci) + 0.5*(float64(i)+0.5)/float64(len(modes)) - 0.25
			ep.XYs = append(ep.XYs, plotter.XY{X: x, Y: s.Median})
			ep.YErrors = append(ep.YErrors, struct{ Low, High float64 }{s.Median - s.Min, s.Max - s.Median})
			lo, hi = min(lo, s.Min), max(hi, s.Max)
		}
		if len(ep.XYs) == 0 {
			continue
		}
		sc, err := plotter.NewScatter(ep.XYs)
		if err != nil {
			return nil, err
		}
		sc.Color, sc.Shape, sc.Radius = plotutil.Color(i), plotutil.Shape(i), vg.Points(4)
		eb, err := plotter.NewYErrorBars(ep)
		if err != nil {
			return nil, err
		}
		eb.Color = plotutil.Color(i)
		p.Add(sc, eb)
		p.Legend.Add(mode, sc)
	}
	if hi == 0 {
		return nil, nil
	}
	p.NominalX(names...)
	p.X.Min, p.X.Max = -0.5, float64(len(cats))-0.5
	p.Y.Min, p.Y.Max = lo/2, hi*2
	return p, nil
}

// WritePNG draws the plots (throughput against write size, ping-pong latency
// percentiles, messages per second) one above the other into a PNG file. title
// describes the run (machine, date).
func WritePNG(path string, rows []Row, title string) error {
	var ps [][]*plot.Plot
	for _, f := range []func([]Row, string) (*plot.Plot, error){throughputPlot, latencyPlot, messagesPlot} {
		p, err := f(rows, title)
		if err != nil {
			return err
		}
		if p != nil {
			ps = append(ps, []*plot.Plot{p})
		}
	}
	const w, h = 9 * vg.Inch, 4.5 * vg.Inch
	img := vgimg.NewWith(vgimg.UseWH(w, h*vg.Length(len(ps))), vgimg.UseDPI(110))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(ps), Cols: 1, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 6,
		PadTop: vg.Millimeter * 3, PadBottom: vg.Millimeter * 3, PadLeft: vg.Millimeter * 3, PadRight: vg.Millimeter * 3}
	cs := plot.Align(ps, tiles, dc)
	for i := range ps {
		ps[i][0].Draw(cs[i][0])
	}
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
