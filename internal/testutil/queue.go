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
