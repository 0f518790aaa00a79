//go:build linux

package virtiobench

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/engine"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
	"github.com/rakelimit/caddy-rakelimit/lab/xdpbench"
)

// GuestOptions are the agent's flags: what `rakebench-virtio guest` gets
// from the guest's init.
type GuestOptions struct {
	// Listen is the agent's address; Caddy the caddy binary; Iface the
	// NIC; Dir Caddy's directory (its Caddyfile, admin socket, log and
	// data, kept from one Caddy to the next: one tls internal authority).
	Listen, Caddy, Iface, Dir string
}

// ParseGuestFlags reads the agent's options from args.
func ParseGuestFlags(args []string, stderr io.Writer) (*GuestOptions, error) {
	fs := flag.NewFlagSet("rakebench-virtio guest", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &GuestOptions{}
	fs.StringVar(&o.Listen, "listen", agentAddr(), "the agent's address")
	fs.StringVar(&o.Caddy, "caddy", "/caddy", "the caddy binary")
	fs.StringVar(&o.Iface, "iface", guestIf, "the NIC")
	fs.StringVar(&o.Dir, "dir", "/tmp/caddy", "Caddy's directory")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	return o, nil
}

// Info is what the agent says of the guest.
type Info struct {
	Kernel   string `json:"kernel"`
	CPUs     int    `json:"cpus"`
	CPUModel string `json:"cpu_model"`
	// Driver is the NIC's driver; QueuePairs its combined channels in use
	// and at most.
	Driver        string `json:"driver"`
	QueuePairs    int    `json:"queue_pairs"`
	MaxQueuePairs int    `json:"max_queue_pairs"`
}

// Started is the agent's answer to a start: the mode Caddy's limiter runs
// in and the interfaces its XDP program runs on (name and attach, from
// its admin view).
type Started struct {
	Mode string   `json:"mode"`
	XDP  []string `json:"xdp,omitempty"`
}

// Reading is what the agent reads in the guest at each end of a window.
type Reading struct {
	// Stat is /proc/stat: all CPUs, then each.
	Stat []Ticks `json:"stat"`
	// Caddy is Caddy's CPU time, ticks.
	Caddy uint64 `json:"caddy"`
	// Dropped and Passed are the limiter's counts (for the floor, Dropped
	// is its program's run count); XDPRuns the frames Caddy's XDP program
	// ran on; SocketDrops the drops of Caddy's UDP sockets.
	Dropped     uint64 `json:"dropped"`
	Passed      uint64 `json:"passed"`
	XDPRuns     uint64 `json:"xdp_runs"`
	SocketDrops uint64 `json:"socket_drops"`
	// NIC are the NIC's counters (rx_packets, rx_dropped) and Attach how
	// an XDP program runs on it, as ip link says.
	NIC    LinkStats `json:"nic"`
	Attach string    `json:"attach"`
}

// agent serves the host's requests in the guest, one at a time.
type agent struct {
	o     *GuestOptions
	mu    sync.Mutex
	caddy *xdpbench.Caddy
	floor *xdpbench.Floor
	stop  context.CancelFunc
}

// Serve runs the agent until ctx ends or the host asks it to power off.
func Serve(ctx context.Context, o *GuestOptions, log io.Writer) error {
	// The kernel's program statistics, on while the agent runs: the
	// floor's drops and the frames Caddy's XDP program ran on.
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		return fmt.Errorf("enabling BPF program statistics: %w", err)
	}
	defer stats.Close()
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	a := &agent{o: o, stop: cancel}
	defer a.stopCaddy()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /info", a.handle(func(r *http.Request) (any, error) { return a.info() }))
	mux.HandleFunc("POST /start", a.handle(func(r *http.Request) (any, error) {
		queues, err := strconv.Atoi(r.FormValue("queues"))
		if err != nil {
			return nil, fmt.Errorf("queues %q: %w", r.FormValue("queues"), err)
		}
		return a.start(ctx, r.Context(), r.FormValue("mode"), queues)
	}))
	mux.HandleFunc("GET /read", a.handle(func(r *http.Request) (any, error) { return a.read(r.Context()) }))
	mux.HandleFunc("GET /log", a.handle(func(*http.Request) (any, error) { return a.log() }))
	mux.HandleFunc("POST /stop", a.handle(func(*http.Request) (any, error) { a.stopCaddy(); return struct{}{}, nil }))
	mux.HandleFunc("POST /poweroff", a.handle(func(*http.Request) (any, error) { cancel(); return struct{}{}, nil }))
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, done := context.WithTimeout(context.Background(), 2*time.Second)
		defer done()
		srv.Shutdown(shutdown)
	}()
	fmt.Fprintf(log, "rakebench-virtio guest: listening on %s\n", o.Listen)
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("agent: %w", err)
	}
	return nil
}

// handle answers a request with fn's result as JSON, or its error as a
// 500 with the error's text.
func (a *agent) handle(fn func(r *http.Request) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		v, err := fn(r)
		a.mu.Unlock()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(v)
	}
}

// info describes the guest.
func (a *agent) info() (Info, error) {
	in := Info{CPUs: runtime.NumCPU(), CPUModel: "unknown"}
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return in, fmt.Errorf("uname: %w", err)
	}
	in.Kernel = unix.ByteSliceToString(uts.Release[:])
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				in.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if d, err := os.Readlink(filepath.Join("/sys/class/net", a.o.Iface, "device/driver")); err == nil {
		in.Driver = filepath.Base(d)
	}
	var err error
	in.QueuePairs, in.MaxQueuePairs, err = queuePairs(a.o.Iface)
	return in, err
}

// start starts a fresh Caddy in mode (ModeFloor: mode bpf behind the
// floor's program) with queues of the NIC's queue pairs in use. Caddy runs
// until life ends (or the next start or stop); req bounds the wait for it.
func (a *agent) start(life, req context.Context, mode string, queues int) (*Started, error) {
	a.stopCaddy()
	caddyMode := mode
	switch mode {
	case engine.ModeBPF, engine.ModeXDP:
	case xdpbench.ModeFloor:
		caddyMode = engine.ModeBPF
	default:
		return nil, fmt.Errorf("mode %q: want %s, %s or %s", mode, engine.ModeBPF, engine.ModeXDP, xdpbench.ModeFloor)
	}
	// Before any XDP program runs on the NIC: virtio-net refuses to
	// change its channels under one.
	if err := setQueuePairs(a.o.Iface, queues); err != nil {
		return nil, err
	}
	c, err := xdpbench.Site{Bin: a.o.Caddy, Dir: a.o.Dir, Addr: guestAddr, Mode: caddyMode, Wait: 3 * time.Minute}.Start(life)
	if err != nil {
		return nil, err
	}
	a.caddy = c
	v, err := c.View(req)
	if err != nil {
		return nil, err
	}
	if v.Mode != caddyMode {
		return nil, fmt.Errorf("caddy runs in mode %s, asked for %s", v.Mode, caddyMode)
	}
	st := &Started{Mode: v.Mode}
	for _, x := range v.XDP {
		st.XDP = append(st.XDP, x.Name+" "+x.Attach)
	}
	if mode == xdpbench.ModeFloor {
		if a.floor, err = xdpbench.AttachFloor(a.o.Iface); err != nil {
			return nil, err
		}
	}
	return st, nil
}

// log is the end of Caddy's log (the last or the running Caddy's).
func (a *agent) log() (string, error) {
	b, err := os.ReadFile(filepath.Join(a.o.Dir, "caddy.log"))
	if err != nil {
		return "", err
	}
	return testutil.Tail(b), nil
}

// stopCaddy stops Caddy and removes the floor's program, if they run.
func (a *agent) stopCaddy() {
	if a.floor != nil {
		a.floor.Close()
		a.floor = nil
	}
	if a.caddy != nil {
		a.caddy.Stop()
		a.caddy = nil
	}
}

// read reads the guest, Caddy and the limiter.
func (a *agent) read(ctx context.Context) (*Reading, error) {
	if a.caddy == nil {
		return nil, errors.New("no caddy runs")
	}
	rd := &Reading{}
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return nil, err
	}
	if rd.Stat, err = ParseStat(b); err != nil {
		return nil, err
	}
	if rd.Caddy, err = xdpbench.ProcTicks(a.caddy.Pid()); err != nil {
		return nil, err
	}
	if a.floor != nil {
		rd.Dropped, err = a.floor.Runs()
	} else {
		rd.Dropped, rd.Passed, err = a.caddy.Counts(ctx)
	}
	if err != nil {
		return nil, err
	}
	if rd.XDPRuns, err = xdpbench.ProgramRuns(xdpbench.XDPProgramName); err != nil {
		return nil, err
	}
	if rd.SocketDrops, err = xdpbench.UDPDrops(xdpbench.HTTPSPort); err != nil {
		return nil, err
	}
	for _, c := range []struct {
		name string
		v    *uint64
	}{{"rx_packets", &rd.NIC.RxPackets}, {"rx_dropped", &rd.NIC.RxDropped}, {"tx_packets", &rd.NIC.TxPackets}, {"tx_dropped", &rd.NIC.TxDropped}} {
		b, err := os.ReadFile(filepath.Join("/sys/class/net", a.o.Iface, "statistics", c.name))
		if err != nil {
			return nil, err
		}
		if *c.v, err = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err != nil {
			return nil, fmt.Errorf("%s of %s: %w", c.name, a.o.Iface, err)
		}
	}
	out, err := exec.CommandContext(ctx, "ip", "link", "show", "dev", a.o.Iface).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("ip link show dev %s: %w: %s", a.o.Iface, err, out)
	}
	rd.Attach = XDPAttach(string(out))
	return rd, nil
}
