package testutil

import (
	"testing"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/engine/backlog"
)

// WaitRead waits until Caddy has read every datagram queued on its sockets
// on port: the kernel's rx_queue is empty. It fails t after 30 s.
func WaitRead(t *testing.T, port int) {
	t.Helper()
	time.Sleep(100 * time.Millisecond) // datagrams in flight
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		q, err := backlog.SocketQueued(port)
		if err != nil {
			t.Fatal(err)
		}
		if q == 0 {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("Caddy left %d bytes unread on port %d for 30 s", q, port)
		}
	}
}

// ReadDrops reads the drop counters of the UDP sockets on port (and the
// system's receive-queue overflows); with an earlier reading,
// backlog.Drops.FilteredSince says how many datagrams their filters dropped
// since. It fails t when /proc cannot be read.
func ReadDrops(t testing.TB, port int) backlog.Drops {
	t.Helper()
	d, err := backlog.ReadDrops(port)
	if err != nil {
		t.Fatalf("reading the drops of the sockets on port %d: %v", port, err)
	}
	return d
}
