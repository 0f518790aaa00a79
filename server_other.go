//go:build !unix

package rakelimit

import "net"

// sameSocketFile reports false: inherited socket files (network fdgram)
// exist on Unix only.
func sameSocketFile(int, *net.UDPConn) bool { return false }
