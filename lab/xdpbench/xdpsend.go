//go:build linux

package xdpbench

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// The senders: SenderXDP hands frames to the veth the way a NIC's driver
// hands them to the kernel, as XDP frames (BPF_PROG_TEST_RUN in live-frame
// mode, a program that redirects each into the sender's end of the veth):
// the receiving end's NAPI poll gets them without a socket buffer, runs the
// XDP program on them, and builds a socket buffer only for what it passes.
// SenderSocket sends from UDP sockets (sendmmsg): the veth then receives
// socket buffers the sender allocated, on which even the XDP program runs,
// which understates what XDP saves on a NIC.
const (
	SenderXDP    = "xdp"
	SenderSocket = "socket"
)

// Senders lists the senders.
var Senders = []string{SenderXDP, SenderSocket}

// liveRepeat is how many frames one live-frame run sends: short enough for
// the flood's time to bound it closely.
const liveRepeat = 20_000

// redirector loads a program that redirects every frame to the interface
// of index ifindex.
func redirector(ifindex int) (*ebpf.Program, error) {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "bench_redirect", Type: ebpf.XDP, License: "MIT",
		Instructions: asm.Instructions{
			asm.Mov.Imm(asm.R1, int32(ifindex)),
			asm.Mov.Imm(asm.R2, 0),
			asm.FnRedirect.Call(),
			asm.Return(),
		},
	})
	if err != nil {
		return nil, fmt.Errorf("loading the sender's redirect program: %w", err)
	}
	return prog, nil
}

// frame builds an Ethernet frame of a UDP datagram over IPv6 from src to
// dst with payload, between the MAC addresses given, with the UDP checksum
// IPv6 demands (the kernel's UDP input drops a datagram without one).
func frame(srcMAC, dstMAC net.HardwareAddr, src, dst netip.AddrPort, payload []byte) []byte {
	udpLen := 8 + len(payload)
	b := make([]byte, 14+40+udpLen)
	copy(b[0:6], dstMAC)
	copy(b[6:12], srcMAC)
	binary.BigEndian.PutUint16(b[12:], unix.ETH_P_IPV6)
	ip := b[14:]
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], uint16(udpLen))
	ip[6], ip[7] = unix.IPPROTO_UDP, 64
	s, d := src.Addr().As16(), dst.Addr().As16()
	copy(ip[8:], s[:])
	copy(ip[24:], d[:])
	udp := ip[40:]
	binary.BigEndian.PutUint16(udp[0:], src.Port())
	binary.BigEndian.PutUint16(udp[2:], dst.Port())
	binary.BigEndian.PutUint16(udp[4:], uint16(udpLen))
	copy(udp[8:], payload)
	// The checksum over the pseudo-header and the datagram.
	var sum uint32
	add := func(p []byte) {
		for i := 0; i+1 < len(p); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(p[i:]))
		}
		if len(p)%2 == 1 {
			sum += uint32(p[len(p)-1]) << 8
		}
	}
	add(ip[8:40])
	sum += uint32(udpLen) + unix.IPPROTO_UDP
	add(udp)
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	c := ^uint16(sum)
	if c == 0 {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(udp[6:], c)
	return b
}

// SendFrames sends the flood to dst as XDP frames from ns's interface
// ifname to the MAC address dstMAC: each sender runs the redirect program
// in live-frame mode on frames of its sources in turn, until its share of
// the count is sent or the flood's time is up; the interface hands them on
// as it transmits (a veth to its peer's NAPI poll, a tap to the reader of
// its queue). Without a rate the runs follow each other; with one, each
// sender paces its runs. It returns what it sent and for how long.
func (f Flood) SendFrames(ns *testutil.NetNS, ifname string, dstMAC net.HardwareAddr, dst netip.AddrPort) (int, time.Duration, error) {
	if err := f.check(dst); err != nil {
		return 0, 0, err
	}
	var srcMAC net.HardwareAddr
	var ifindex int
	if err := ns.Enter(func() error {
		iface, err := net.InterfaceByName(ifname)
		if err == nil {
			srcMAC, ifindex = iface.HardwareAddr, iface.Index
		}
		return err
	}); err != nil {
		return 0, 0, fmt.Errorf("flood: %w", err)
	}
	prog, err := redirector(ifindex)
	if err != nil {
		return 0, 0, err
	}
	defer prog.Close()
	frames := make([][][]byte, f.Senders)
	for i := range f.Sources {
		data := payloads(f.Kind, uint64(i)+1)[0]
		src := netip.AddrPortFrom(netip.MustParseAddr(FloodSource(i)), uint16(40000+i))
		frames[i%f.Senders] = append(frames[i%f.Senders], frame(srcMAC, dstMAC, src, dst, data))
	}
	start := time.Now()
	var mu sync.Mutex
	total := 0
	var firstErr error
	var wg sync.WaitGroup
	for s := range f.Senders {
		wg.Go(func() {
			var n int
			err := ns.Enter(func() error {
				var err error
				n, err = f.sendLive(prog, frames[s], start)
				return err
			})
			mu.Lock()
			defer mu.Unlock()
			total += n
			if err != nil && firstErr == nil {
				firstErr = err
			}
		})
	}
	wg.Wait()
	return total, time.Since(start), firstErr
}

// sendLive is one sender's loop of live-frame runs.
func (f Flood) sendLive(prog *ebpf.Program, frames [][]byte, start time.Time) (int, error) {
	count := f.Count / f.Senders
	rate := float64(f.Rate) / float64(f.Senders)
	sent := 0
	for turn := 0; sent < count; turn++ {
		elapsed := time.Since(start)
		if elapsed >= f.For {
			break
		}
		n := min(liveRepeat, count-sent)
		if rate > 0 {
			due := int(elapsed.Seconds()*rate) - sent
			if due <= 0 {
				time.Sleep(time.Millisecond)
				continue
			}
			n = min(n, due)
		}
		if _, err := prog.Run(&ebpf.RunOptions{Data: frames[turn%len(frames)], Repeat: uint32(n),
			Flags: unix.BPF_F_TEST_XDP_LIVE_FRAMES, BatchSize: 64}); err != nil {
			return sent, fmt.Errorf("flood: a live-frame run: %w", err)
		}
		sent += n
	}
	return sent, nil
}

// enableGRO turns on GRO on the interface name of the calling thread's
// namespace: a veth without an XDP program receives XDP frames only with
// its NAPI on, which GRO turns on.
func enableGRO(name string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("enabling GRO on %s: %w", name, err)
	}
	defer unix.Close(fd)
	// struct ethtool_value, and struct ifreq pointing at it; both on the
	// heap, where nothing moves them.
	value := &struct{ cmd, data uint32 }{unix.ETHTOOL_SGRO, 1}
	ifr := &struct {
		name [unix.IFNAMSIZ]byte
		data uintptr
		_    [16]byte
	}{data: uintptr(unsafe.Pointer(value))}
	copy(ifr.name[:], name)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(ifr)))
	runtime.KeepAlive(value)
	if errno != 0 {
		return fmt.Errorf("enabling GRO on %s: %w", name, errno)
	}
	return nil
}
