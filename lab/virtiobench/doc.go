//go:build linux

// Package virtiobench is the benchmark behind lab/cmd/rakebench-virtio:
// xdpbench's comparison of the socket filter (mode bpf), the XDP program
// (mode xdp) and the floor (an XDP program that only drops), on a driver
// that runs XDP on its own receive ring: virtio-net, in a guest under QEMU
// (KVM where the host has it, QEMU's emulator elsewhere, where CPU per
// packet means nothing).
//
// The host makes a network namespace with a tap in it; QEMU, started
// there, gives the guest a virtio-net NIC on the tap (QEMU's own backend:
// vhost=off) with a queue pair per vCPU, and boots a Debian kernel
// (kernel.sh fetches it into .ci/kernels.sh's cache) with a root in memory:
// busybox, iproute2's ip, the NIC's modules, Caddy, and this command, which
// runs there as the agent (`rakebench-virtio guest`: an HTTP server on the
// guest's address). For each sample the host asks the agent to start a
// fresh Caddy in a mode, with the NIC's queue pairs of the setup in use,
// waits until the legit client gets the page, reads the guest through the
// agent, floods Caddy's HTTP/3 port through the tap (xdpbench's floods: XDP
// frames redirected into the tap, or datagrams from sockets) while the
// legit client fetches the page on a new connection every 100 ms, and
// reads again. A guest is booted for each count of vCPUs in the setups;
// its setups, floods, rates and modes are interleaved, in the reverse
// order every other repetition.
//
// What a sample reads in the guest: /proc/stat (every vCPU's softirq,
// system, interrupt and user time), Caddy's CPU, the limiter's drops
// (Caddy's metrics; the floor's program's run count), the frames Caddy's
// XDP program ran on, the NIC's counters and how ip link says an XDP
// program runs on it (xdp: native; xdpgeneric). The figure sought is the
// guest kernel's CPU (softirq, system and hard interrupts) per datagram
// dropped, mode xdp's and the floor's over the socket filter's; the report
// also gives the guest's busy CPU (with Caddy's user time) per drop, the
// drops per second of busy guest CPU, xdpbench's tables over the same
// samples (the guest's softirq and Caddy's CPU, as the veth counts), and
// the drops with more queues against fewer.
//
// The files:
//
//   - options.go: the flags and the setups
//   - initramfs.go: the guest's root and its init
//   - machine.go: the namespace, the tap, QEMU and the agent's client
//   - guest.go, ethtool.go: the agent, in the guest
//   - proc.go: what the agent and the host parse (/proc/stat, ip link)
//   - run.go: the run and its samples
//   - report.go: medians, ratios, results.md and results.json
//
// Network rule: the tap and every address are in the namespace the run
// makes and removes (fd00:78:c::/64 between the host's side and the guest,
// the flood's sources in xdpbench's fd00:78:b0::/48); the floods go only
// to the guest's address, each bounded by a count and a duration.
package virtiobench
