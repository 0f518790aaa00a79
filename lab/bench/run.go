//go:build linux

package bench

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/lab/dashboard"
)

// requestRate is each legitimate client's requests per second.
const requestRate = 25

// gtlsFetches is the number of gtlsclient fetches per scenario.
const gtlsFetches = 3

// reflectionGrace is how long a flood's sockets keep listening for replies
// after the last datagram.
const reflectionGrace = 250 * time.Millisecond

// Report is everything a run measured; results.json holds it.
type Report struct {
	Date      string      `json:"date"`
	Command   []string    `json:"command"`
	Machine   Machine     `json:"machine"`
	Settings  Settings    `json:"settings"`
	Variants  []Variant   `json:"variants"`
	Scenarios []Scenario  `json:"scenarios"`
	Runs      []RunResult `json:"runs"`
	Summary   []Summary   `json:"summary"`
	Elapsed   float64     `json:"elapsed_seconds"`
	Notes     []string    `json:"notes,omitempty"`
	sizes     transferSizes
}

// Machine describes where the run happened and what ran.
type Machine struct {
	CPU        string `json:"cpu"`
	Cores      int    `json:"cores"`
	Kernel     string `json:"kernel"`
	Go         string `json:"go"`
	Caddy      string `json:"caddy"`
	Modules    string `json:"modules,omitempty"`
	Revision   string `json:"revision,omitempty"`
	Gtlsclient string `json:"gtlsclient"`
}

// Settings are the run's parameters after scaling.
type Settings struct {
	Reps                    int           `json:"reps"`
	Scale                   float64       `json:"scale"`
	TransferScale           float64       `json:"transfer_scale"`
	FloodSeconds            float64       `json:"flood_seconds"`
	FloodMax                uint64        `json:"flood_max"`
	RequestRate             int           `json:"request_rate"`
	TimeoutSeconds          float64       `json:"request_timeout_seconds"`
	GtlsFetches             int           `json:"gtlsclient_fetches"`
	Sizes                   transferSizes `json:"transfer_bytes"`
	StallSeconds            float64       `json:"transfer_stall_seconds"`
	TransferTimeoutSeconds  float64       `json:"transfer_timeout_seconds"`
	StopTimeoutSeconds      float64       `json:"stop_timeout_seconds"`
	FloodStopTimeoutSeconds float64       `json:"flood_stop_timeout_seconds"`
}

// RunResult is one scenario with one variant in one repetition.
type RunResult struct {
	Scenario string `json:"scenario"`
	Variant  string `json:"variant"`
	Rep      int    `json:"rep"`
	// Seconds is the measured window: from the flood's start to the last
	// request's end (or the transfers').
	Seconds     float64      `json:"seconds"`
	Flood       *FloodResult `json:"flood,omitempty"`
	NewConn     *LegitStats  `json:"new_connection,omitempty"`
	Established *LegitStats  `json:"established,omitempty"`
	Gtls        *LegitStats  `json:"gtlsclient,omitempty"`
	// Attacker is the attacker's own connection (FloodSpec.Attacker);
	// Returning the returning client (Scenario.Returning).
	Attacker  *LegitStats      `json:"attacker,omitempty"`
	Returning *LegitStats      `json:"returning,omitempty"`
	Server    ServerStats      `json:"server"`
	Transfers []TransferResult `json:"transfers,omitempty"`
	// StopSeconds is the time from SIGTERM to Caddy's exit; StopTimedOut
	// is set when it had to be killed.
	StopSeconds  float64 `json:"stop_seconds"`
	StopTimedOut bool    `json:"stop_timed_out"`
}

// ServerStats is Caddy's side of a scenario.
type ServerStats struct {
	// CPUPct is Caddy's CPU time over the window, in % of one core;
	// CPUSeconds the time itself.
	CPUPct       float64 `json:"cpu_pct"`
	CPUSeconds   float64 `json:"cpu_seconds"`
	PeakRSSBytes uint64  `json:"peak_rss_bytes"`
	// SocketDrops is the rise of the drops column of Caddy's UDP socket:
	// datagrams the filter refused plus those a full receive buffer lost.
	SocketDrops uint64 `json:"socket_drops"`
	// ModuleRefused and ModuleDelivered total the module's verdicts.
	ModuleRefused   float64 `json:"module_refused"`
	ModuleDelivered float64 `json:"module_delivered"`
	// RcvbufDrops is SocketDrops - ModuleRefused, or SocketDrops when the
	// module runs in userspace, where it refuses datagrams after the
	// socket has received them.
	RcvbufDrops float64 `json:"rcvbuf_drops"`
	// Userspace is set when the module decided in userspace.
	Userspace bool          `json:"userspace,omitempty"`
	Module    []ModuleGroup `json:"module,omitempty"`
	Series    []Series      `json:"series,omitempty"`
}

// bench is the state of one run.
type bench struct {
	o        *Options
	progress io.Writer
	dir      string
	bin      string
	gtls     string // gtlsclient's path, empty when not used
	site     site
	sizes    transferSizes
	backend  *uploadBackend
	// dash is the dashboard -dashboard renders, nil without it; recorded
	// is its scenario run's scrapes, once made.
	dash     *dashboard.Compiled
	recorded *recording
	// flights are the client first flights of warm-ups, made once.
	flights [][]byte
}

// Run runs the benchmark and writes its outputs; progress lines go to
// progress. Every Caddy it starts is stopped before it returns, also when
// ctx ends.
func Run(ctx context.Context, o *Options, progress io.Writer) (*Report, error) {
	began := time.Now()
	b := &bench{o: o, progress: progress, sizes: sizesFor(o.TransferScale)}
	dir, err := os.MkdirTemp("", "rakebench-")
	if err != nil {
		return nil, fmt.Errorf("creating a temporary directory: %w", err)
	}
	if o.Keep {
		fmt.Fprintf(progress, "rakebench: keeping %s\n", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	b.dir = dir
	rep := &Report{Date: began.UTC().Format(time.RFC3339), Command: o.Args, Variants: o.Variants, Scenarios: o.Scenarios}
	if err := b.setup(ctx, rep); err != nil {
		return nil, err
	}
	defer b.backend.close()
	total := o.Reps * len(o.Scenarios) * len(o.Variants)
	i := 0
	runsBegan := time.Now()
	for r := 1; r <= o.Reps; r++ {
		for _, sc := range o.Scenarios {
			for _, v := range o.Variants {
				i++
				fmt.Fprintf(progress, "rakebench: [%d/%d] rep %d %s/%s (%s)\n", i, total, r, sc.Name, v.Name,
					timeLeft(time.Since(runsBegan), i-1, total))
				res, err := b.runOne(ctx, sc, v, r)
				if err != nil {
					if ctx.Err() != nil {
						return nil, fmt.Errorf("interrupted: %w", context.Cause(ctx))
					}
					return nil, fmt.Errorf("scenario %s, variant %s, rep %d: %w", sc.Name, v.Name, r, err)
				}
				fmt.Fprintf(progress, "rakebench: [%d/%d]   %s\n", i, total, oneLine(res))
				rep.Runs = append(rep.Runs, res)
			}
		}
	}
	rep.Summary = summarizeRuns(rep.Runs, o.Variants, o.Scenarios)
	rep.Elapsed = time.Since(began).Seconds()
	if b.recorded != nil {
		rep.Notes = append(rep.Notes, dashboardNote(b.recorded))
	}
	if err := writeOutputs(rep, o.Out, o.Readme); err != nil {
		return nil, err
	}
	if b.recorded != nil {
		path, err := writeDashboard(b.dash, b.recorded, rep.Date, o.Out)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(progress, "rakebench: wrote %s\n", path)
	}
	fmt.Fprintf(progress, "rakebench: done in %.0f s; wrote %s\n", rep.Elapsed, filepath.Join(o.Out, "results.md"))
	return rep, nil
}

// Rerender reads the results.json of an earlier run and writes its
// results.md, charts and README section again with this version's report
// code: the figures are the run's, recomputed medians and ratios included.
func Rerender(o *Options, progress io.Writer) (*Report, error) {
	b, err := os.ReadFile(o.From)
	if err != nil {
		return nil, fmt.Errorf("-from: %w", err)
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		return nil, fmt.Errorf("-from %s: %w", o.From, err)
	}
	if len(rep.Runs) == 0 || len(rep.Variants) == 0 || rep.Variants[0].Name != Plain {
		return nil, fmt.Errorf("-from %s: no runs, or no plain variant first", o.From)
	}
	rep.Summary = summarizeRuns(rep.Runs, rep.Variants, rep.Scenarios)
	if err := writeOutputs(&rep, o.Out, o.Readme); err != nil {
		return nil, err
	}
	fmt.Fprintf(progress, "rakebench: rendered %s from %s (run of %s)\n", filepath.Join(o.Out, "results.md"), o.From, rep.Date)
	return &rep, nil
}

// setup finds or builds Caddy, picks ports, writes the files, starts the
// upload backend and validates every variant.
func (b *bench) setup(ctx context.Context, rep *Report) error {
	o := b.o
	var err error
	if o.Dashboard != "" {
		if b.dash, err = loadDashboard(); err != nil {
			return err
		}
	}
	if o.Caddy != "" {
		if st, err := os.Stat(o.Caddy); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			return fmt.Errorf("-caddy %s: not an executable file", o.Caddy)
		}
		b.bin = o.Caddy
	} else if b.bin, err = buildCaddy(ctx, b.dir, b.progress); err != nil {
		return err
	}
	rep.Machine = machine()
	if o.Caddy == "" {
		// When go build does not stamp the revision (-buildvcs=false),
		// ask git.
		rep.Machine.Revision, rep.Notes = gitRevision(ctx)
	}
	if rep.Machine.Caddy, err = caddyVersion(ctx, b.bin); err != nil {
		return err
	}
	if info, err := buildinfo.ReadFile(b.bin); err == nil {
		rep.Machine.Go = info.GoVersion
		var mods []string
		for _, d := range info.Deps {
			if d.Path == "github.com/quic-go/quic-go" || d.Path == "github.com/cilium/ebpf" {
				mods = append(mods, d.Path+" "+d.Version)
			}
		}
		rep.Machine.Modules = strings.Join(mods, ", ")
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" {
				rep.Machine.Revision = s.Value
			}
			if s.Key == "vcs.modified" && s.Value == "true" && len(rep.Notes) == 0 {
				rep.Notes = append(rep.Notes, dirtyNote)
			}
		}
	}
	rep.Machine.Gtlsclient = "off"
	if o.Gtls != GtlsOff {
		if b.gtls, err = exec.LookPath("gtlsclient"); err != nil {
			if o.Gtls == GtlsRequire {
				return errors.New("-gtlsclient require: gtlsclient is not installed (Debian package ngtcp2-client)")
			}
			b.gtls, rep.Machine.Gtlsclient = "", "not installed"
		} else {
			rep.Machine.Gtlsclient = "installed"
		}
	}
	s := site{port: o.Port, adminPort: o.AdminPort, storage: filepath.Join(b.dir, "storage"), www: filepath.Join(b.dir, "www")}
	if s.port != 0 {
		if err := checkPortFree("-port", s.port, true); err != nil {
			return err
		}
	} else if s.port, err = freePort(s.adminPort); err != nil {
		return err
	}
	if s.adminPort != 0 {
		if err := checkPortFree("-admin-port", s.adminPort, false); err != nil {
			return err
		}
	} else if s.adminPort, err = freePort(s.port); err != nil {
		return err
	}
	if s.httpPort, err = freePort(s.port, s.adminPort); err != nil {
		return err
	}
	if b.backend, err = startBackend(); err != nil {
		return err
	}
	s.backendPort = b.backend.port
	b.site = s
	sizes := transferSizes{Download: 1, Each: 1}
	for _, sc := range o.Scenarios {
		if sc.Transfers {
			sizes = b.sizes
			fmt.Fprintf(b.progress, "rakebench: writing %d MB of files to serve\n", (sizes.Download+sizes.Each)/1e6)
		}
	}
	if err := writeFiles(s.www, sizes); err != nil {
		b.backend.close()
		return err
	}
	for _, v := range o.Variants {
		if err := validateVariant(ctx, b.bin, b.dir, s, v); err != nil {
			b.backend.close()
			return err
		}
	}
	rep.Settings = Settings{
		Reps: o.Reps, Scale: o.Scale, TransferScale: o.TransferScale,
		FloodSeconds: o.floodDuration().Seconds(), FloodMax: o.FloodMax,
		RequestRate: requestRate, TimeoutSeconds: o.Timeout.Seconds(), GtlsFetches: gtlsFetches,
		Sizes: b.sizes, StallSeconds: o.stallTimeout().Seconds(),
		TransferTimeoutSeconds: o.transferTimeout().Seconds(), StopTimeoutSeconds: o.stopTimeout().Seconds(),
		FloodStopTimeoutSeconds: o.floodStopTimeout().Seconds(),
	}
	if b.gtls == "" {
		rep.Settings.GtlsFetches = 0
	}
	return nil
}

const dirtyNote = "Caddy was built from a work tree with uncommitted changes."

// gitRevision returns the commit of the repository in the working directory
// and a note when the work tree has changes; nothing when git cannot tell.
func gitRevision(ctx context.Context) (string, []string) {
	out, err := exec.CommandContext(ctx, "git", "rev-parse", "HEAD").Output()
	if err != nil {
		return "", nil
	}
	rev := strings.TrimSpace(string(out))
	status, err := exec.CommandContext(ctx, "git", "status", "--porcelain", "--untracked-files=no").Output()
	if err == nil && len(bytes.TrimSpace(status)) > 0 {
		return rev, []string{dirtyNote}
	}
	return rev, nil
}

// machine describes this machine.
func machine() Machine {
	m := Machine{Cores: runtime.NumCPU(), CPU: "unknown", Kernel: "unknown"}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = "Linux " + string(bytes.TrimSpace(b))
	}
	return m
}

// runOne starts a fresh Caddy for one scenario and variant, measures and
// stops it.
func (b *bench) runOne(ctx context.Context, sc Scenario, v Variant, rep int) (RunResult, error) {
	res := RunResult{Scenario: sc.Name, Variant: v.Name, Rep: rep}
	c, err := startCaddy(ctx, b.bin, b.dir, b.site, v, fmt.Sprintf("%s-%s-%d", sc.Name, v.Name, rep), 30*time.Second)
	if err != nil {
		return res, err
	}
	stopped := false
	defer func() {
		if !stopped {
			c.Stop(b.o.stopTimeout())
		}
	}()
	var rec *recorder
	if b.dash != nil && sc.Name == b.o.Dashboard && v.Name == b.o.DashboardVariant && rep == 1 {
		fmt.Fprintf(b.progress, "rakebench: scraping /metrics every %v for %s, from %v before to %v after the measured window\n",
			dashboardInterval, DashboardSVG, dashboardLead, dashboardTail)
		rec = startRecorder(ctx, c, b.dash.Metrics())
		defer rec.stop()
		if err := sleepCtx(ctx, dashboardLead); err != nil {
			return res, err
		}
	}
	measured := time.Now()
	if sc.Transfers {
		err = b.measureTransfers(ctx, c, &res)
	} else {
		err = b.measureFlood(ctx, c, sc, &res)
	}
	if err != nil {
		return res, err
	}
	if rec != nil {
		window := dashboard.Span{From: measured, To: time.Now(), Label: windowLabel(sc)}
		if err := sleepCtx(ctx, dashboardTail); err != nil {
			return res, err
		}
		r := rec.stop()
		r.scenario, r.variant, r.window = sc, v.Name, window
		b.recorded = &r
	}
	grace := b.o.floodStopTimeout()
	if sc.Transfers {
		grace = b.o.stopTimeout()
	}
	d, ok := c.Stop(grace)
	stopped = true
	res.StopSeconds, res.StopTimedOut = d.Seconds(), !ok
	return res, nil
}

// window measures Caddy's side between begin and end.
type window struct {
	c     *caddyProc
	s0    procSample
	m0    counters
	start time.Time
}

func (b *bench) begin(ctx context.Context, c *caddyProc) (*window, error) {
	w := &window{c: c}
	var err error
	if w.m0, err = scrape(ctx, c); err != nil {
		return nil, err
	}
	if err := c.resetPeakRSS(); err != nil {
		return nil, err
	}
	if w.s0, err = c.sample(); err != nil {
		return nil, err
	}
	w.start = w.s0.at
	return w, nil
}

func (w *window) end(ctx context.Context, res *RunResult) error {
	s1, err := w.c.sample()
	if err != nil {
		return err
	}
	rss, err := w.c.peakRSS()
	if err != nil {
		return err
	}
	body, err := w.c.admin(ctx, "/metrics")
	if err != nil {
		return fmt.Errorf("reading caddy's metrics: %w", err)
	}
	m1, err := parseCounters(bytes.NewReader(body))
	if err != nil {
		return err
	}
	userspace, err := inUserspace(bytes.NewReader(body))
	if err != nil {
		return err
	}
	series := m1.delta(w.m0)
	groups := summarize(series)
	refused, delivered := refusedDelivered(groups)
	drops := s1.drops - w.s0.drops
	rcvbuf := float64(drops) - refused
	if userspace {
		// The userspace limiter refuses datagrams the socket has
		// received: every socket drop is a full receive buffer.
		rcvbuf = float64(drops)
	}
	res.Seconds = s1.at.Sub(w.start).Seconds()
	res.Server = ServerStats{
		CPUPct: cpuPercent(w.s0, s1), CPUSeconds: float64(s1.cpuTicks-w.s0.cpuTicks) / clockTicks,
		PeakRSSBytes: rss, SocketDrops: drops,
		ModuleRefused: refused, ModuleDelivered: delivered, RcvbufDrops: rcvbuf, Userspace: userspace,
		Module: groups, Series: series,
	}
	return nil
}

// scrape reads the module's counters from Caddy's admin endpoint.
func scrape(ctx context.Context, c *caddyProc) (counters, error) {
	body, err := c.admin(ctx, "/metrics")
	if err != nil {
		return nil, fmt.Errorf("reading caddy's metrics: %w", err)
	}
	return parseCounters(bytes.NewReader(body))
}

// measureFlood runs the flood (if any) and the clients for the flood
// duration.
func (b *bench) measureFlood(ctx context.Context, c *caddyProc, sc Scenario, res *RunResult) error {
	dst := c.dst()
	// The established client connects before the flood.
	est, err := dialH3(ctx, establishedSrc, dst)
	if err != nil {
		return fmt.Errorf("established client, before the flood: %w", err)
	}
	defer est.close()
	if _, err := est.get(ctx, "/", page, nil); err != nil {
		return fmt.Errorf("established client, before the flood: %w", err)
	}
	// The returning client's first visit, before the flood.
	if sc.Returning {
		if _, err := newConnGet(ctx, returningSrc, dst, "/", page); err != nil {
			return fmt.Errorf("returning client, before the flood: %w", err)
		}
	}
	var fl *flood
	var attacker *h3Conn
	if sc.Flood != nil {
		if attacker, fl, err = b.openFlood(ctx, sc, dst, res.Rep); err != nil {
			return err
		}
		defer fl.close()
		if attacker != nil {
			defer attacker.close()
		}
	}
	w, err := b.begin(ctx, c)
	if err != nil {
		return err
	}
	d := b.o.floodDuration()
	var wg sync.WaitGroup
	var fres FloodResult
	if fl != nil {
		wg.Go(func() { fres = fl.run(ctx, d, b.o.FloodMax, seedOf(sc.Name, res.Rep)) })
	}
	var newConn, established, gtls LegitStats
	wg.Go(func() {
		newConn = paced(ctx, d, requestRate, b.o.Timeout, func(rctx context.Context) (time.Duration, error) {
			return newConnGet(rctx, newConnSrc, dst, "/", page)
		})
	})
	wg.Go(func() {
		established = paced(ctx, d, requestRate, b.o.Timeout, func(rctx context.Context) (time.Duration, error) {
			start := time.Now()
			_, err := est.get(rctx, "/", page, nil)
			return time.Since(start), err
		})
	})
	if b.gtls != "" {
		wg.Go(func() { gtls = b.gtlsDuring(ctx, d, dst.Port()) })
	}
	var attackerStats, returning LegitStats
	if attacker != nil {
		wg.Go(func() {
			attackerStats = paced(ctx, d, attackerRate, b.o.Timeout, func(rctx context.Context) (time.Duration, error) {
				start := time.Now()
				_, err := attacker.get(rctx, "/", page, nil)
				return time.Since(start), err
			})
		})
	}
	if sc.Returning {
		wg.Go(func() {
			returning = paced(ctx, d, returningRate, b.o.Timeout, func(rctx context.Context) (time.Duration, error) {
				return newConnGet(rctx, returningSrc, dst, "/", page)
			})
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if fl != nil {
		fl.finish(&fres, reflectionGrace)
		res.Flood = &fres
		if fres.Sent == 0 {
			return fmt.Errorf("the flood sent nothing (%d send errors, first: %s)", fres.SendErrors, fres.FirstError)
		}
	}
	if err := w.end(ctx, res); err != nil {
		return err
	}
	res.NewConn, res.Established = &newConn, &established
	if b.gtls != "" {
		res.Gtls = &gtls
	}
	if attacker != nil {
		res.Attacker = &attackerStats
	}
	if sc.Returning {
		res.Returning = &returning
	}
	if newConn.Attempted == 0 || established.Attempted == 0 {
		return fmt.Errorf("no legitimate requests made (new connection %d, established %d)", newConn.Attempted, established.Attempted)
	}
	return nil
}

// openFlood opens the scenario's flood to dst and, before it runs, what it
// needs: the attacker's own connection (returned, nil without one), whose
// server ID it carries, and the warm-up's datagrams.
func (b *bench) openFlood(ctx context.Context, sc Scenario, dst netip.AddrPort, rep int) (*h3Conn, *flood, error) {
	spec := sc.Flood
	if spec.Kind.needsServerID() && !spec.Attacker.IsValid() {
		return nil, nil, fmt.Errorf("flood of %s needs an attacker's connection", spec.Kind)
	}
	var attacker *h3Conn
	var id [quicclass.ServerIDLen]byte
	if spec.Attacker.IsValid() {
		var err error
		if attacker, id, err = dialAttacker(ctx, spec.Attacker, dst); err != nil {
			return nil, nil, fmt.Errorf("attacker's connection, before the flood: %w", err)
		}
		if _, err := attacker.get(ctx, "/", page, nil); err != nil {
			attacker.close()
			return nil, nil, fmt.Errorf("attacker's connection, before the flood: %w", err)
		}
	}
	fail := func(err error) (*h3Conn, *flood, error) {
		if attacker != nil {
			attacker.close()
		}
		return nil, nil, err
	}
	fl, err := openFlood(spec, dst.Port())
	if err != nil {
		return fail(err)
	}
	fl.serverID = id
	if spec.Warmup {
		if len(b.flights) < spec.SpoofedSet {
			fmt.Fprintf(b.progress, "rakebench: making %d client first flights for the warm-up\n", spec.SpoofedSet)
			if b.flights, err = clientFlights(ctx, spec.SpoofedSet); err != nil {
				fl.close()
				return fail(err)
			}
		}
		if err := fl.prepareWarmup(b.flights, seedOf(sc.Name, rep)); err != nil {
			fl.close()
			return fail(err)
		}
	}
	return attacker, fl, nil
}

// gtlsDuring runs gtlsFetches gtlsclient fetches spread over d.
func (b *bench) gtlsDuring(ctx context.Context, d time.Duration, port uint16) LegitStats {
	var log requestLog
	start := time.Now()
	for i := 1; i <= gtlsFetches; i++ {
		at := start.Add(d * time.Duration(i) / (gtlsFetches + 1))
		select {
		case <-ctx.Done():
			return log.stats()
		case <-time.After(time.Until(at)):
		}
		lat, err := gtlsGet(ctx, b.gtls, b.dir, int(port), b.o.Timeout)
		if ctx.Err() != nil {
			return log.stats()
		}
		log.add(lat, err)
	}
	return log.stats()
}

// measureTransfers runs the transfers with no flood.
func (b *bench) measureTransfers(ctx context.Context, c *caddyProc, res *RunResult) error {
	w, err := b.begin(ctx, c)
	if err != nil {
		return err
	}
	id := fmt.Sprintf("%s-%d", res.Variant, res.Rep)
	trs, err := transfers(ctx, c.dst(), b.sizes, b.backend, id, b.o.transferTimeout(), b.o.stallTimeout())
	if err != nil {
		return err
	}
	res.Transfers = trs
	return w.end(ctx, res)
}

// seedOf derives a flood's seed from its scenario and repetition.
func seedOf(name string, rep int) uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%d", name, rep)
	return h.Sum64()
}

// oneLine summarizes a run for the progress output.
func oneLine(r RunResult) string {
	var parts []string
	if r.Flood != nil {
		if r.Flood.Spoofed != "" {
			parts = append(parts, fmt.Sprintf("flood %s dgram/s spoofed from %s addresses in %s", count(r.Flood.OfferedPPS), count(float64(r.Flood.Addresses)), r.Flood.Spoofed))
		} else {
			parts = append(parts, fmt.Sprintf("flood %s dgram/s from %d sockets, reflected %s", count(r.Flood.OfferedPPS), r.Flood.Sockets, count(float64(r.Flood.Reflected))))
		}
		if r.Flood.WarmupSent > 0 {
			parts = append(parts, fmt.Sprintf("warm-up %s first flights", count(float64(r.Flood.WarmupSent))))
		}
		if r.Flood.ServerID != "" {
			parts = append(parts, "server ID "+r.Flood.ServerID)
		}
	}
	legit := func(name string, s *LegitStats) {
		if s != nil {
			p99 := "-"
			if s.P99Ms != nil {
				p99 = fmt.Sprintf("%.0fms", *s.P99Ms)
			}
			parts = append(parts, fmt.Sprintf("%s %d/%d p99 %s", name, s.OK, s.Attempted, p99))
		}
	}
	legit("new", r.NewConn)
	legit("established", r.Established)
	legit("gtlsclient", r.Gtls)
	legit("attacker", r.Attacker)
	legit("returning", r.Returning)
	for _, t := range r.Transfers {
		s := fmt.Sprintf("%s %.0f Mbit/s", t.Name, t.Mbps)
		if t.TimedOut {
			s += fmt.Sprintf(" TIMEOUT (%s of %s)", count(float64(t.Got)), count(float64(t.Expected)))
		} else if t.Error != "" {
			s += " error: " + t.Error
		}
		parts = append(parts, s)
	}
	parts = append(parts, fmt.Sprintf("cpu %.0f%%, rss %.0f MB, socket drops %s", r.Server.CPUPct, float64(r.Server.PeakRSSBytes)/1e6, count(float64(r.Server.SocketDrops))))
	if r.Server.ModuleRefused > 0 || r.Server.ModuleDelivered > 0 {
		parts = append(parts, fmt.Sprintf("module refused %s, delivered %s", count(r.Server.ModuleRefused), count(r.Server.ModuleDelivered)))
	}
	if pct, ok := kernelRefusedPct(r); ok {
		parts = append(parts, fmt.Sprintf("refused in the kernel %.1f%% of the flood", pct))
	}
	if pct, ok := deliveredPct(r); ok {
		parts = append(parts, fmt.Sprintf("delivered to quic-go %.1f%% of the flood", pct))
	}
	stop := fmt.Sprintf("stop %.3fs", r.StopSeconds)
	if r.StopTimedOut {
		stop = "stop TIMEOUT"
	}
	return strings.Join(append(parts, stop), "; ")
}
