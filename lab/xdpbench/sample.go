//go:build linux

package xdpbench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/engine"
	"github.com/rakelimit/caddy-rakelimit/internal/engine/report"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// Sample is one measurement: a mode under one flood at one rate, in one
// repetition, on a fresh Caddy.
type Sample struct {
	Mode  string `json:"mode"`
	Flood string `json:"flood"`
	// Rate is the rate asked for, datagrams per second; 0 is the
	// sender's maximum.
	Rate int `json:"rate"`
	Rep  int `json:"rep"`
	// Seconds is the flood's window.
	Seconds float64 `json:"seconds"`
	// Sent is what the sender sent; Dropped what the limiter dropped
	// (limits and invalid; in ModeFloor, the frames the floor's program
	// saw), SocketDrops what the socket's queue dropped
	// (the socket filter's refusals among them).
	Sent    int    `json:"sent"`
	Dropped uint64 `json:"dropped"`
	// Passed is what the limiter let through (passed or limited; none in
	// ModeFloor).
	Passed uint64 `json:"passed"`
	// XDPRuns is how many frames Caddy's XDP program ran on (mode xdp; the
	// kernel's program statistics): those it dropped, passed, or passed
	// untouched (not to the listener).
	XDPRuns     uint64 `json:"xdp_runs,omitempty"`
	SocketDrops uint64 `json:"socket_drops"`
	// SoftirqSeconds is the machine's softirq time in the window,
	// CaddySeconds Caddy's CPU time, SenderSeconds this process's (the
	// sender and the legit client).
	SoftirqSeconds float64 `json:"softirq_seconds"`
	CaddySeconds   float64 `json:"caddy_seconds"`
	SenderSeconds  float64 `json:"sender_seconds"`
	// LegitOK of LegitTotal requests of the legit client got the page.
	LegitOK    int `json:"legit_ok"`
	LegitTotal int `json:"legit_total"`
	// XDP are the interfaces the admin view said the XDP program ran on.
	XDP []string `json:"xdp,omitempty"`
}

// SentPPS is the flood's rate as sent.
func (s Sample) SentPPS() float64 { return float64(s.Sent) / s.Seconds }

// DroppedPPS is the limiter's drops per second.
func (s Sample) DroppedPPS() float64 { return float64(s.Dropped) / s.Seconds }

// ReceiveCPU is the receiving side's CPU time: softirq and Caddy.
func (s Sample) ReceiveCPU() float64 { return s.SoftirqSeconds + s.CaddySeconds }

// NsPerDrop is the receiving side's CPU per datagram the limiter dropped,
// in nanoseconds.
func (s Sample) NsPerDrop() float64 {
	if s.Dropped == 0 {
		return 0
	}
	return s.ReceiveCPU() * 1e9 / float64(s.Dropped)
}

// LegitShare is the share of the legit client's requests that got the page.
func (s Sample) LegitShare() float64 {
	if s.LegitTotal == 0 {
		return 0
	}
	return float64(s.LegitOK) / float64(s.LegitTotal)
}

// The site: Caddy's HTTPS port and what its page says.
const (
	HTTPSPort  = 8443
	httpPort   = 8080
	PageMarker = "rakebench-xdp-page"
)

// Site is a Caddy that serves the benchmark's page over HTTP/3 on
// HTTPSPort, with rakelimit in one mode.
type Site struct {
	// Bin is the binary of ./cmd/caddy; Prefix, when set, a command that
	// runs it (such as ip netns exec).
	Bin    string
	Prefix []string
	// Dir holds its Caddyfile, admin socket, log and data (its tls
	// internal authority among them).
	Dir string
	// Addr is the address it serves the page at, besides localhost; Mode
	// is rakelimit's mode.
	Addr, Mode string
	// Ready, when set, is what shows that Caddy serves the page, once its
	// admin endpoint answers; Wait bounds the wait (0: 30 s).
	Ready func(ctx context.Context) error
	Wait  time.Duration
}

// Caddy is a running Caddy of a Site.
type Caddy struct {
	proc  *testutil.CaddyProcess
	admin string
}

// Start starts Caddy, ready once its admin endpoint answers and s.Ready
// returns nil.
func (s Site) Start(ctx context.Context) (*Caddy, error) {
	c := &Caddy{admin: filepath.Join(s.Dir, "admin.sock")}
	cfg := filepath.Join(s.Dir, "Caddyfile")
	body := fmt.Sprintf(`{
	admin unix/%s
	skip_install_trust
	local_certs
	http_port %d
	https_port %d
}
localhost:%d, [%s]:%d {
	tls internal
	rakelimit {
		mode %s
	}
	respond "%s"
}
`, c.admin, httpPort, HTTPSPort, HTTPSPort, s.Addr, HTTPSPort, s.Mode, PageMarker)
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		return nil, err
	}
	tc := testutil.Caddy{Bin: s.Bin, Prefix: s.Prefix, Config: cfg, LogFile: filepath.Join(s.Dir, "caddy.log"), Wait: s.Wait,
		Env: append(os.Environ(), "XDG_DATA_HOME="+filepath.Join(s.Dir, "data"), "XDG_CONFIG_HOME="+filepath.Join(s.Dir, "config")),
		Ready: func(ctx context.Context) error {
			if _, err := c.get(ctx, "/config/"); err != nil {
				return err
			}
			if s.Ready != nil {
				return s.Ready(ctx)
			}
			return nil
		}}
	var err error
	c.proc, err = tc.Start(ctx)
	if err != nil {
		return nil, fmt.Errorf("starting caddy in mode %s: %w", s.Mode, err)
	}
	return c, nil
}

// startCaddy starts Caddy in the server's namespace with rakelimit in mode,
// ready once the legit client gets the page.
func (r *runner) startCaddy(ctx context.Context, mode string) (*Caddy, error) {
	dir, err := os.MkdirTemp("", "rakebench-xdp-")
	if err != nil {
		return nil, err
	}
	return Site{Bin: r.o.Caddy, Prefix: []string{"ip", "netns", "exec", r.lab.server.Name()}, Dir: dir, Addr: serverAddr(), Mode: mode,
		Ready: func(ctx context.Context) error {
			ok, err := r.legit(ctx)
			if err == nil && !ok {
				err = fmt.Errorf("not the page")
			}
			return err
		}}.Start(ctx)
}

// Stop stops Caddy and waits for it.
func (c *Caddy) Stop() { c.proc.Stop(5 * time.Second) }

// Pid is Caddy's process ID.
func (c *Caddy) Pid() int { return c.proc.Pid() }

// get fetches path from Caddy's admin endpoint.
func (c *Caddy) get(ctx context.Context, path string) ([]byte, error) {
	client := http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", c.admin)
	}}}
	defer client.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://localhost"+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("admin %s: %w", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("admin %s: %s", path, resp.Status)
	}
	return b, err
}

// View is the admin view of Caddy's one limiter.
func (c *Caddy) View(ctx context.Context) (report.Limiter, error) {
	b, err := c.get(ctx, "/rakelimit/")
	if err != nil {
		return report.Limiter{}, err
	}
	var v report.View
	if err := json.Unmarshal(b, &v); err != nil || len(v.Limiters) != 1 {
		return report.Limiter{}, fmt.Errorf("the admin view %.200s: %v, want one limiter", b, err)
	}
	return v.Limiters[0], nil
}

// Counts sums the limiter's verdicts in Caddy's metrics (ParseCounts).
func (c *Caddy) Counts(ctx context.Context) (dropped, passed uint64, err error) {
	b, err := c.get(ctx, "/metrics")
	if err != nil {
		return 0, 0, err
	}
	return ParseCounts(b)
}

// ParseCounts sums the limiter's verdicts in caddy_rakelimit_packets_total
// of a Prometheus exposition: dropped, the datagrams counted dropped or
// invalid; passed, those counted passed or limited (let through).
func ParseCounts(metrics []byte) (dropped, passed uint64, err error) {
	var drop, pass float64
	sc := bufio.NewScanner(bytes.NewReader(metrics))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "caddy_rakelimit_packets_total{") {
			continue
		}
		var sum *float64
		switch {
		case strings.Contains(line, `verdict="dropped"`), strings.Contains(line, `verdict="invalid"`):
			sum = &drop
		case strings.Contains(line, `verdict="passed"`), strings.Contains(line, `verdict="limited"`):
			sum = &pass
		default:
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, 0, fmt.Errorf("parsing %q: %w", line, err)
		}
		*sum += v
	}
	return uint64(drop), uint64(pass), sc.Err()
}

// legit makes one request of the legit client, on a new connection.
func (r *runner) legit(ctx context.Context) (bool, error) {
	var body string
	err := r.lab.sender.Enter(func() error {
		var err error
		body, _, err = testutil.HTTP3Get(ctx, netip.MustParseAddr(clientAddr()),
			fmt.Sprintf("https://[%s]:%d/", serverAddr(), HTTPSPort))
		return err
	})
	return err == nil && strings.Contains(body, PageMarker), err
}

// XDPProgramName is the name of Caddy's XDP program, as the kernel lists
// it (the ELF section's function, cut to 15 bytes).
const XDPProgramName = "rakelimit_xdp"

// reading is what a sample reads at each end of its window.
type reading struct {
	at          time.Time
	softirq     uint64 // ticks, every CPU
	caddy       uint64 // ticks, Caddy's utime + stime
	self        time.Duration
	dropped     uint64
	passed      uint64
	xdpRuns     uint64
	socketDrops uint64
}

// clockTicks is USER_HZ, the unit of /proc/stat and /proc/PID/stat.
const clockTicks = 100

// read reads the machine, Caddy and the limiter (or the floor's program
// in front of it).
func (r *runner) read(ctx context.Context, c *Caddy, fl *Floor) (reading, error) {
	var rd reading
	rd.at = time.Now()
	var err error
	if rd.softirq, err = softirqTicks(); err != nil {
		return rd, err
	}
	if rd.caddy, err = ProcTicks(c.Pid()); err != nil {
		return rd, err
	}
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return rd, fmt.Errorf("getrusage: %w", err)
	}
	rd.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	if fl != nil {
		rd.dropped, err = fl.Runs()
	} else {
		rd.dropped, rd.passed, err = c.Counts(ctx)
	}
	if err != nil {
		return rd, err
	}
	if rd.xdpRuns, err = ProgramRuns(XDPProgramName); err != nil {
		return rd, err
	}
	err = r.lab.server.Enter(func() error {
		var err error
		rd.socketDrops, err = UDPDrops(HTTPSPort)
		return err
	})
	return rd, err
}

// softirqTicks is /proc/stat's softirq time of every CPU.
func softirqTicks() (uint64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	return strconv.ParseUint(f[7], 10, 64)
}

// ProcTicks is a process's utime + stime, every thread's, in USER_HZ
// ticks.
func ProcTicks(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	_, rest, ok := strings.Cut(string(b), ") ")
	f := strings.Fields(rest)
	if !ok || len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected %q", pid, b)
	}
	// After the name: state (3) ... utime (14), stime (15).
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	s, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: times %q %q", pid, f[11], f[12])
	}
	return u + s, nil
}

// UDPDrops sums the drop counters of the IPv6 UDP sockets on port, in the
// calling thread's namespace.
func UDPDrops(port int) (uint64, error) {
	b, err := os.ReadFile("/proc/thread-self/net/udp6")
	if err != nil {
		return 0, err
	}
	suffix := fmt.Sprintf(":%04X", port)
	var sum uint64
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 13 || !strings.HasSuffix(f[1], suffix) {
			continue
		}
		n, err := strconv.ParseUint(f[len(f)-1], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/net/udp6: %q: %w", line, err)
		}
		sum += n
	}
	return sum, nil
}

// sample measures mode under flood in repetition rep.
func (r *runner) sample(ctx context.Context, mode string, flood Flood, rep int) (Sample, error) {
	s := Sample{Mode: mode, Flood: flood.Kind, Rate: flood.Rate, Rep: rep}
	caddyMode := mode
	if mode == ModeFloor {
		caddyMode = engine.ModeBPF
	}
	c, err := r.startCaddy(ctx, caddyMode)
	if err != nil {
		return s, err
	}
	defer c.Stop()
	v, err := c.View(ctx)
	if err != nil {
		return s, err
	}
	if v.Mode != caddyMode {
		return s, fmt.Errorf("caddy runs in mode %s, asked for %s", v.Mode, caddyMode)
	}
	var fl *Floor
	if mode == ModeFloor {
		if fl, err = r.lab.attachFloor(); err != nil {
			return s, err
		}
		defer fl.Close()
	}
	for _, x := range v.XDP {
		s.XDP = append(s.XDP, x.Name+" "+x.Attach)
	}
	before, err := r.read(ctx, c, fl)
	if err != nil {
		return s, err
	}
	// The legit client, while the flood lasts.
	stopLegit := Legit(ctx, r.legit)
	dst := netip.AddrPortFrom(netip.MustParseAddr(serverAddr()), HTTPSPort)
	var sent int
	var elapsed time.Duration
	var ferr error
	if r.o.Sender == SenderXDP {
		sent, elapsed, ferr = r.lab.sendFrames(flood, dst)
	} else {
		sent, elapsed, ferr = flood.Send(r.lab.sender, dst)
	}
	after, err := r.read(ctx, c, fl)
	s.LegitOK, s.LegitTotal = stopLegit()
	if ferr != nil {
		return s, ferr
	}
	if err != nil {
		return s, err
	}
	s.Seconds, s.Sent = elapsed.Seconds(), sent
	s.Dropped, s.SocketDrops = after.dropped-before.dropped, after.socketDrops-before.socketDrops
	s.Passed, s.XDPRuns = after.passed-before.passed, after.xdpRuns-before.xdpRuns
	s.SoftirqSeconds = float64(after.softirq-before.softirq) / clockTicks
	s.CaddySeconds = float64(after.caddy-before.caddy) / clockTicks
	s.SenderSeconds = (after.self - before.self).Seconds()
	return s, nil
}

// Legit runs the legit client while a flood lasts: a request on a new
// connection every 100 ms, each within 2 s, with get, until the stop it
// returns is called, which waits for the requests under way and says how
// many of how many got the page.
func Legit(ctx context.Context, get func(context.Context) (bool, error)) (stop func() (ok, total int)) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var got, sent int
	wg.Go(func() {
		tk := time.NewTicker(100 * time.Millisecond)
		defer tk.Stop()
		for {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				defer cancel()
				page, _ := get(ctx)
				mu.Lock()
				defer mu.Unlock()
				sent++
				if page {
					got++
				}
			})
			select {
			case <-done:
				return
			case <-tk.C:
			}
		}
	})
	return func() (int, int) {
		close(done)
		wg.Wait()
		return got, sent
	}
}
