package backlog

import (
	"net"
	"runtime"
	"strings"
	"testing"
)

// errorWanted reports whether a case wanted an error (want is not ""), and
// fails t unless err then says want.
func errorWanted(t *testing.T, name string, err error, want string) bool {
	t.Helper()
	if want == "" {
		return false
	}
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("%s: err = %v, want one saying %q", name, err, want)
	}
	return true
}

func TestParseSocketDrops(t *testing.T) {
	// Port 8443 is 0x20FB; the flood's connected sockets have it as the
	// remote port and must not count.
	const udp6 = `  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops
 1234: 00000000000000000000000000000000:20FB 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 99 2 0000000000000000 1500
 1235: 0000000000000000FFFF00000100007F:D431 0000000000000000FFFF00000100007F:20FB 01 00000000:00000000 00:00000000 00000000     0        0 98 2 0000000000000000 7
 1236: 00000000000000000000000000000000:20FC 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 97 2 0000000000000000 9
 1237: 0100007F:20FB 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 96 2 0000000000000000 25
`
	tests := []struct {
		name    string
		table   string
		port    int
		want    uint64
		wantErr string
	}{
		{"bound to the port, IPv6 and IPv4", udp6, 8443, 1525, ""},
		{"another port", udp6, 8444, 9, ""},
		{"no socket", udp6, 9, 0, ""},
		{"bad drops column", " 1: 0100007F:0009 00000000:0000 07 0:0 0:0 0 0 0 1 2 0 many\n", 9, 0, `drops column "many"`},
		{"port 0", udp6, 0, 0, "port 0 is not a UDP port"},
		{"port over 65535", udp6, 70000, 0, "port 70000 is not a UDP port"},
	}
	for _, tt := range tests {
		got, err := ParseSocketDrops(strings.NewReader(tt.table), tt.port)
		if errorWanted(t, tt.name, err, tt.wantErr) {
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("%s: ParseSocketDrops = %d, %v; want %d", tt.name, got, err, tt.want)
		}
	}
}

func TestParseUDPCounters(t *testing.T) {
	const snmp = `Ip: Forwarding DefaultTTL
Ip: 1 64
Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors
Udp: 1000 2 30 4000 25 0 0 0 0
UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors
UdpLite: 9 9 9 9 9 9 9 9 9
`
	const snmp6 = `Ip6InReceives                   	55
Udp6InDatagrams                 	600
Udp6NoPorts                     	1
Udp6RcvbufErrors                	7
UdpLite6InDatagrams             	9
`
	tests := []struct {
		name        string
		snmp, snmp6 string
		want        UDPCounters
		wantErr     string
	}{
		{"both tables", snmp, snmp6, UDPCounters{InDatagrams: 1000, InDatagrams6: 600, RcvbufErrors: 25, RcvbufErrors6: 7}, ""},
		{"no Udp table", "Ip: Forwarding\nIp: 1\n", snmp6, UDPCounters{}, "no Udp: table"},
		{"no IPv6 counters", snmp, "Ip6InReceives 5\n", UDPCounters{}, "no UDP counter Udp6InDatagrams"},
		{"names and values differ", "Udp: InDatagrams RcvbufErrors\nUdp: 1\n", snmp6, UDPCounters{}, "2 names but 1 values"},
		{"bad value", "Udp: InDatagrams RcvbufErrors\nUdp: 1 x\n", snmp6, UDPCounters{}, `RcvbufErrors "x"`},
	}
	for _, tt := range tests {
		got, err := ParseUDPCounters(tt.snmp, tt.snmp6)
		if errorWanted(t, tt.name, err, tt.wantErr) {
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("%s: ParseUDPCounters = %+v, %v; want %+v", tt.name, got, err, tt.want)
		}
	}
}

func TestFilteredSince(t *testing.T) {
	tests := []struct {
		name   string
		d0, d1 Drops
		want   uint64
	}{
		{"filter drops only", Drops{Socket: 10, Overflow: 5}, Drops{Socket: 110, Overflow: 5}, 100},
		{"overflows are not the filter's", Drops{Socket: 10, Overflow: 5}, Drops{Socket: 110, Overflow: 35}, 70},
		{"other sockets overflowed", Drops{Socket: 10, Overflow: 5}, Drops{Socket: 20, Overflow: 500}, 0},
	}
	for _, tt := range tests {
		if got := tt.d1.FilteredSince(tt.d0); got != tt.want {
			t.Errorf("%s: FilteredSince = %d, want %d", tt.name, got, tt.want)
		}
	}
}

// TestReadDrops reads this machine's counters, for a socket of this test:
// it is there, with no drops yet.
func TestReadDrops(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("/proc/net is Linux's")
	}
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	d, err := ReadDrops(conn.LocalAddr().(*net.UDPAddr).Port)
	if err != nil {
		t.Fatal(err)
	}
	if d.Socket != 0 {
		t.Errorf("a new socket has %d drops", d.Socket)
	}
	c, err := ReadUDPCounters()
	if err != nil {
		t.Fatal(err)
	}
	if c.RcvbufErrors+c.RcvbufErrors6 < d.Overflow {
		t.Errorf("the overflow counters went down: %+v after %d", c, d.Overflow)
	}
}

func TestParseSocketQueued(t *testing.T) {
	const table = `  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops
 1234: 00000000000000000000000000000000:20FB 00000000000000000000000000000000:0000 07 00000000:00000A00 00:00000000 00000000     0        0 99 2 0000000000000000 1500
 1235: 0000000000000000FFFF00000100007F:D431 0000000000000000FFFF00000100007F:20FB 01 00000000:00000100 00:00000000 00000000     0        0 98 2 0000000000000000 7
 1237: 0100007F:20FB 00000000:0000 07 00000000:00000010 00:00000000 00000000     0        0 96 2 0000000000000000 25
`
	tests := []struct {
		name    string
		table   string
		port    int
		want    uint64
		wantErr string
	}{
		{"bound to the port, IPv6 and IPv4", table, 8443, 0xa00 + 0x10, ""},
		{"no socket", table, 9, 0, ""},
		{"bad queue column", " 1: 0100007F:0009 00000000:0000 07 00000000 0:0 0 0 0 1 2 0 0\n", 9, 0, `queue column "00000000"`},
		{"port 0", table, 0, 0, "port 0 is not a UDP port"},
	}
	for _, tt := range tests {
		got, err := ParseSocketQueued(strings.NewReader(tt.table), tt.port)
		if errorWanted(t, tt.name, err, tt.wantErr) {
			continue
		}
		if got != tt.want {
			t.Errorf("%s: %d queued, want %d", tt.name, got, tt.want)
		}
	}
}
