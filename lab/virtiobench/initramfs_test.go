//go:build linux

package virtiobench

import (
	"slices"
	"strings"
	"testing"
)

// TestInitScript: the guest's init configures the addresses the host
// expects and starts an agent whose flags parse to them.
func TestInitScript(t *testing.T) {
	s := initScript()
	for _, want := range []string{"#!/bin/busybox sh\n", "virtio_net", "IP=/usr/bin/ip\n",
		"$IP addr add fd00:78:c::1/64 dev eth0 nodad\n", "$IP -6 route add fd00:78:b0::/48 dev eth0\n",
		"$IP -6 neigh replace fd00:78:c::2 lladdr 52:54:00:78:0c:02 dev eth0 nud permanent\n",
		"echo 262144 >/proc/sys/net/core/optmem_max\n", "\npoweroff -f\n"} {
		if !strings.Contains(s, want) {
			t.Errorf("the init lacks %q:\n%s", want, s)
		}
	}
	var agent []string
	for _, line := range strings.Split(s, "\n") {
		if strings.HasPrefix(line, agentPath+" guest ") {
			agent = strings.Fields(strings.ReplaceAll(line, "'", ""))
		}
	}
	if agent == nil {
		t.Fatalf("the init starts no agent:\n%s", s)
	}
	o, err := ParseGuestFlags(agent[2:], new(strings.Builder))
	if err != nil || o.Listen != agentAddr() || o.Caddy != caddyPath || o.Iface != guestIf {
		t.Errorf("the agent's flags %q: %+v, %v", agent, o, err)
	}
}

// TestLddPaths: the libraries ldd names by path, the loader among them.
func TestLddPaths(t *testing.T) {
	out := "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibbpf.so.1 => /lib/x86_64-linux-gnu/libbpf.so.1 (0x00007f7b)\n" +
		"\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f7a)\n\t/lib64/ld-linux-x86-64.so.2 (0x00007f7c)\n"
	want := []string{"/lib/x86_64-linux-gnu/libbpf.so.1", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"}
	if got := lddPaths(out); !slices.Equal(got, want) {
		t.Errorf("lddPaths = %q, want %q", got, want)
	}
	if got := lddPaths("\tnot a dynamic executable\n"); len(got) != 0 {
		t.Errorf("a static binary: %q", got)
	}
}

// TestQEMUArgs: KVM or the emulator; a virtio-net NIC on the tap through
// QEMU's own backend, with a queue pair per vCPU.
func TestQEMUArgs(t *testing.T) {
	for _, c := range []struct {
		accel     string
		cpus      int
		want, not []string
	}{
		{AccelKVM, 1, []string{"-accel kvm -cpu host", "-smp 1 -m 1024",
			"-netdev tap,id=n0,ifname=rkvt,script=no,downscript=no,vhost=off -device virtio-net-pci,netdev=n0,mac=52:54:00:78:0c:01"},
			[]string{"queues=", "mq=on"}},
		{AccelTCG, 2, []string{"-accel tcg,thread=multi -cpu max", "-smp 2 ",
			"vhost=off,queues=2 -device virtio-net-pci,netdev=n0,mac=52:54:00:78:0c:01,mq=on,vectors=6"}, nil},
	} {
		args := strings.Join(qemuArgs(c.accel, c.cpus, 1024, "/k/vmlinuz", "/w/root.cpio"), " ")
		for _, w := range append(c.want, "-kernel /k/vmlinuz -initrd /w/root.cpio", "-nodefaults") {
			if !strings.Contains(args, w) {
				t.Errorf("%s, %d vCPUs: %q lacks %q", c.accel, c.cpus, args, w)
			}
		}
		for _, n := range c.not {
			if strings.Contains(args, n) {
				t.Errorf("%s, %d vCPUs: %q has %q", c.accel, c.cpus, args, n)
			}
		}
	}
}
