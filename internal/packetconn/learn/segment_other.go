//go:build !linux

package learn

// segmentSize returns 0: quic-go sends GSO batches on Linux only.
func segmentSize([]byte) int { return 0 }
