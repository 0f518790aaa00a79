//go:build linux

package virtiobench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
	"github.com/rakelimit/caddy-rakelimit/lab/xdpbench"
)

// resolveAccel turns AccelAuto into KVM where the host has hardware
// virtualization (kvm_intel or kvm_amd, and a /dev/kvm it may open), else
// TCG, as .ci/kernels.sh decides: a /dev/kvm alone is not enough, for a
// host that is itself a virtual machine may serve it from a paravirtual
// module (such as kvm_pvm) that boots only kernels built for it.
func resolveAccel(accel string) string {
	if accel != AccelAuto {
		return accel
	}
	if unixWritable("/dev/kvm") {
		for _, m := range []string{"/sys/module/kvm_intel", "/sys/module/kvm_amd"} {
			if st, err := os.Stat(m); err == nil && st.IsDir() {
				return AccelKVM
			}
		}
	}
	return AccelTCG
}

// unixWritable reports whether this process may open path for writing.
func unixWritable(path string) bool {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return false
	}
	f.Close()
	return true
}

// qemuArgs are QEMU's arguments for a guest of cpus vCPUs and memory MiB
// that boots kernel with initrd: a virtio-net NIC on the tap tapName with
// a queue pair per vCPU (virtio-net's XDP wants a queue pair per CPU for
// the transmissions of XDP_TX and XDP_REDIRECT, or it takes a lock; the
// receive path, which the benchmark measures, is native either way) and
// QEMU's own backend (vhost=off: the host has no /dev/vhost-net); the
// console on the serial port.
func qemuArgs(accel string, cpus, memory int, kernel, initrd string) []string {
	var a []string
	switch accel {
	case AccelKVM:
		a = []string{"-accel", "kvm", "-cpu", "host"}
	default:
		a = []string{"-accel", "tcg,thread=multi", "-cpu", "max"}
	}
	netdev := fmt.Sprintf("tap,id=n0,ifname=%s,script=no,downscript=no,vhost=off", tapName)
	device := fmt.Sprintf("virtio-net-pci,netdev=n0,mac=%s", guestMAC)
	if cpus > 1 {
		netdev += fmt.Sprintf(",queues=%d", cpus)
		device += fmt.Sprintf(",mq=on,vectors=%d", 2*cpus+2)
	}
	return append(a, "-smp", strconv.Itoa(cpus), "-m", strconv.Itoa(memory),
		"-nodefaults", "-display", "none", "-no-reboot", "-serial", "stdio",
		"-kernel", kernel, "-initrd", initrd,
		"-append", "console=ttyS0 quiet panic=-1 rdinit=/init",
		"-netdev", netdev, "-device", device)
}

// guest is a booted guest: QEMU in a namespace of its own with the tap,
// and the agent's client.
type guest struct {
	ns      *testutil.NetNS
	qemu    *testutil.Process
	console string
	client  *http.Client
	cpus    int
}

// bootGuest makes the namespace and the tap, boots a guest of cpus vCPUs
// on them, its console to the file console, and waits for its agent.
func bootGuest(ctx context.Context, o *Options, accel, initrd, console string, cpus int) (g *guest, err error) {
	ns, err := testutil.OpenNetNS("rakebench-virtio")
	if err != nil {
		return nil, err
	}
	g = &guest{ns: ns, console: console, cpus: cpus}
	defer func() {
		if err != nil {
			g.close()
		}
	}()
	mq := ""
	if cpus > 1 {
		mq = " multi_queue"
	}
	cmds := []string{"tuntap add dev " + tapName + " mode tap" + mq, "link set " + tapName + " address " + hostMAC,
		"link set " + tapName + " up", fmt.Sprintf("addr add %s/64 dev %s nodad", hostAddr, tapName),
		fmt.Sprintf("neigh replace %s lladdr %s dev %s nud permanent", guestAddr, guestMAC, tapName)}
	for i := range o.Sources {
		cmds = append(cmds, fmt.Sprintf("addr add %s/128 dev %s nodad", xdpbench.FloodSource(i), tapName))
	}
	if err := ns.Run(cmds...); err != nil {
		return g, err
	}
	log, err := os.Create(console)
	if err != nil {
		return g, err
	}
	defer log.Close() // QEMU has its own descriptor
	argv := append([]string{"ip", "netns", "exec", ns.Name(), "qemu-system-x86_64"},
		qemuArgs(accel, cpus, o.Memory, o.Kernel+"/vmlinuz", initrd)...)
	if g.qemu, err = testutil.StartProcess(ctx, argv, os.Environ(), log); err != nil {
		return g, err
	}
	g.client = &http.Client{Transport: &http.Transport{DialContext: g.dial, DisableKeepAlives: true}}
	// Under the emulator a guest takes a minute or so to boot.
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var in Info
		callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := g.call(callCtx, http.MethodGet, "/info", nil, &in)
		cancel()
		switch {
		case err == nil:
			return g, nil
		case ctx.Err() != nil:
			return g, ctx.Err()
		case g.qemu.Exited():
			return g, fmt.Errorf("the guest stopped before its agent answered (%v); its console: %s", g.qemu.Err(), g.tail())
		case time.Now().After(deadline):
			return g, fmt.Errorf("the guest's agent does not answer (%w); its console: %s", err, g.tail())
		}
		time.Sleep(time.Second)
	}
}

// tail is the end of the guest's console.
func (g *guest) tail() string {
	b, err := os.ReadFile(g.console)
	if err != nil {
		return err.Error()
	}
	return testutil.Tail(b)
}

// dial connects to the agent from the namespace.
func (g *guest) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	var c net.Conn
	err := g.ns.Enter(func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, "tcp6", agentAddr())
		return err
	})
	return c, err
}

// call makes a request of the agent (with form, for a POST) and decodes
// its answer into out, within 5 minutes (a start under the emulator takes
// one); when QEMU stops, it fails at once.
func (g *guest) call(ctx context.Context, method, path string, form url.Values, out any) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if g.qemu != nil {
		go func() {
			select {
			case <-g.qemu.Done():
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+agentAddr()+path, body)
	if err != nil {
		return err
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := g.client.Do(req)
	if err != nil {
		return fmt.Errorf("agent %s: %w", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("agent %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("agent %s: %s", path, bytes.TrimSpace(b))
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("agent %s: %w", path, err)
	}
	return nil
}

// caddyLog is the end of Caddy's log in the guest, or why it cannot be
// read.
func (g *guest) caddyLog(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var log string
	if err := g.call(ctx, http.MethodGet, "/log", nil, &log); err != nil {
		return err.Error()
	}
	return log
}

// tapStats reads the tap's counters: what it handed QEMU (tx) and what
// its queues dropped.
func (g *guest) tapStats() (LinkStats, error) {
	out, err := exec.Command("ip", "-n", g.ns.Name(), "-j", "-s", "link", "show", "dev", tapName).Output()
	if err != nil {
		return LinkStats{}, fmt.Errorf("reading the tap's counters: %w", err)
	}
	return ParseLinkStats(out)
}

// legit makes one request of the legit client, on a new connection, from
// the namespace.
func (g *guest) legit(ctx context.Context) (bool, error) {
	var body string
	err := g.ns.Enter(func() error {
		var err error
		body, _, err = testutil.HTTP3Get(ctx, netip.MustParseAddr(hostAddr), fmt.Sprintf("https://[%s]:%d/", guestAddr, xdpbench.HTTPSPort))
		return err
	})
	return err == nil && strings.Contains(body, xdpbench.PageMarker), err
}

// close asks the agent to power the guest off, waits for QEMU (killing it
// after 30 s), and removes the tap and the namespace.
func (g *guest) close() {
	if g.qemu != nil {
		if !g.qemu.Exited() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := g.call(ctx, http.MethodPost, "/poweroff", url.Values{}, nil)
			cancel()
			if err == nil {
				select {
				case <-g.qemu.Done():
				case <-time.After(30 * time.Second):
				}
			}
		}
		g.qemu.Kill()
		<-g.qemu.Done()
	}
	if g.ns != nil {
		g.ns.Run("link del " + tapName)
		g.ns.Close()
	}
}
