//go:build linux

package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// transferSizes are the sizes of the transfers, scaled.
type transferSizes struct {
	Download int64 `json:"download"` // the single download
	Upload   int64 `json:"upload"`   // the single upload
	Each     int64 `json:"each"`     // each of the 20 concurrent downloads
}

func sizesFor(scale float64) transferSizes {
	mb := func(n float64) int64 { return max(int64(n*scale*1e6), 64<<10) }
	return transferSizes{Download: mb(200), Upload: mb(100), Each: mb(10)}
}

// concurrent is the number of concurrent downloads.
const concurrent = 20

// File names under /files/.
const (
	bigFile   = "big.bin"
	smallFile = "small.bin"
)

// writeFiles writes the files the site serves: random bytes, so that nothing
// on the way can compress them.
func writeFiles(dir string, sz transferSizes) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	for _, f := range []struct {
		name string
		size int64
	}{{bigFile, sz.Download}, {smallFile, sz.Each}} {
		if err := writeRandom(filepath.Join(dir, f.name), f.size); err != nil {
			return err
		}
	}
	return nil
}

func writeRandom(path string, size int64) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("creating %s: %w", path, err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	_, err = io.CopyN(w, rand.NewChaCha8([32]byte{1}), size)
	if err == nil {
		err = w.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// uploadBackend is the HTTP server behind Caddy's /upload: it reads the whole
// body and counts the bytes of each upload, by its id query parameter.
type uploadBackend struct {
	srv  *http.Server
	port int
	mu   sync.Mutex
	got  map[string]*atomic.Int64
}

func startBackend() (*uploadBackend, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("starting the upload backend: %w", err)
	}
	b := &uploadBackend{port: ln.Addr().(*net.TCPAddr).Port, got: map[string]*atomic.Int64{}}
	b.srv = &http.Server{Handler: b, ReadHeaderTimeout: 10 * time.Second}
	go b.srv.Serve(ln)
	return b, nil
}

// counter returns the byte counter of upload id.
func (b *uploadBackend) counter(id string) *atomic.Int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	c := b.got[id]
	if c == nil {
		c = new(atomic.Int64)
		b.got[id] = c
	}
	return c
}

func (b *uploadBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	c := b.counter(r.URL.Query().Get("id"))
	buf := make([]byte, 256<<10)
	for {
		n, err := r.Body.Read(buf)
		c.Add(int64(n))
		if err != nil {
			if !errors.Is(err, io.EOF) {
				return
			}
			break
		}
	}
	fmt.Fprint(w, c.Load())
}

func (b *uploadBackend) close() { b.srv.Close() }

// TransferResult is one transfer case. A transfer that stalls or runs out
// of time is kept, with TimedOut and the bytes it got.
type TransferResult struct {
	Name        string  `json:"name"`
	Connections int     `json:"connections"`
	Streams     int     `json:"streams"`
	Expected    int64   `json:"expected_bytes"`
	Got         int64   `json:"got_bytes"`
	Seconds     float64 `json:"seconds"`
	// Mbps is Got over Seconds, in megabits per second.
	Mbps     float64 `json:"mbps"`
	TimedOut bool    `json:"timed_out"`
	Error    string  `json:"error,omitempty"`
}

// The transfer cases, in order.
const (
	transferDownload = "download"
	transferUpload   = "upload"
	transferOneConn  = "20 downloads, 1 connection"
	transferManyConn = "20 downloads, 20 connections"
)

// TransferNames lists the transfer cases in order.
func TransferNames() []string {
	return []string{transferDownload, transferUpload, transferOneConn, transferManyConn}
}

var errStalled = errors.New("stalled")

// transferRun bounds one transfer: done when ctx ends, when the whole
// takes longer than total, or when progress stops rising for stall.
type transferRun struct {
	ctx      context.Context
	cancel   context.CancelCauseFunc
	progress func() int64
	start    time.Time
}

func newTransferRun(ctx context.Context, total, stall time.Duration, progress func() int64) *transferRun {
	tctx, cancel := context.WithCancelCause(ctx)
	r := &transferRun{ctx: tctx, cancel: cancel, progress: progress, start: time.Now()}
	go func() {
		last, lastAt := progress(), time.Now()
		tk := time.NewTicker(50 * time.Millisecond)
		defer tk.Stop()
		deadline := time.NewTimer(total)
		defer deadline.Stop()
		for {
			select {
			case <-tctx.Done():
				return
			case <-deadline.C:
				cancel(fmt.Errorf("not done after %v: %w", total, context.DeadlineExceeded))
				return
			case now := <-tk.C:
				if p := progress(); p != last {
					last, lastAt = p, now
				} else if now.Sub(lastAt) >= stall {
					cancel(fmt.Errorf("no progress for %v: %w", stall, errStalled))
					return
				}
			}
		}
	}()
	return r
}

// result closes the run and fills res from err and the progress.
func (r *transferRun) result(res TransferResult, err error) TransferResult {
	res.Seconds = time.Since(r.start).Seconds()
	cause := context.Cause(r.ctx)
	r.cancel(nil)
	res.Got = r.progress()
	if res.Seconds > 0 {
		res.Mbps = float64(res.Got) * 8 / res.Seconds / 1e6
	}
	switch {
	case cause != nil && (errors.Is(cause, errStalled) || errors.Is(cause, context.DeadlineExceeded)):
		res.TimedOut = true
		res.Error = cause.Error()
	case err != nil:
		res.Error = err.Error()
	case res.Got != res.Expected:
		res.Error = fmt.Sprintf("got %d bytes, want %d", res.Got, res.Expected)
	}
	return res
}

// transfers runs the four transfer cases one after another against dst.
func transfers(ctx context.Context, dst netip.AddrPort, sz transferSizes, backend *uploadBackend, uploadID string, total, stall time.Duration) ([]TransferResult, error) {
	var out []TransferResult
	for _, name := range TransferNames() {
		res, err := transfer(ctx, name, dst, sz, backend, uploadID, total, stall)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err != nil {
			return nil, err
		}
		out = append(out, res)
	}
	return out, nil
}

func transfer(ctx context.Context, name string, dst netip.AddrPort, sz transferSizes, backend *uploadBackend, uploadID string, total, stall time.Duration) (TransferResult, error) {
	var got atomic.Int64
	progress := got.Load
	add := func(n int) { got.Add(int64(n)) }
	res := TransferResult{Name: name, Connections: 1, Streams: 1}
	switch name {
	case transferDownload:
		res.Expected = sz.Download
	case transferUpload:
		res.Expected = sz.Upload
		c := backend.counter(uploadID)
		c.Store(0)
		progress = c.Load
	case transferOneConn:
		res.Streams, res.Expected = concurrent, concurrent*sz.Each
	case transferManyConn:
		res.Connections, res.Streams, res.Expected = concurrent, concurrent, concurrent*sz.Each
	default:
		return res, fmt.Errorf("unknown transfer %q", name)
	}
	run := newTransferRun(ctx, total, stall, progress)
	var err error
	switch name {
	case transferDownload:
		err = download(run.ctx, transferSrc, dst, "/files/"+bigFile, add)
	case transferUpload:
		err = upload(run.ctx, netip.AddrFrom4([4]byte{127, 77, 0, 11}), dst, uploadID, sz.Upload)
	case transferOneConn:
		var h *h3Conn
		if h, err = dialH3(run.ctx, netip.AddrFrom4([4]byte{127, 77, 0, 12}), dst); err == nil {
			var wg sync.WaitGroup
			errs := make([]error, concurrent)
			for i := range concurrent {
				wg.Go(func() { _, errs[i] = h.get(run.ctx, "/files/"+smallFile, "", add) })
			}
			wg.Wait()
			h.close()
			err = errors.Join(errs...)
		}
	case transferManyConn:
		var wg sync.WaitGroup
		errs := make([]error, concurrent)
		for i := range concurrent {
			wg.Go(func() { errs[i] = download(run.ctx, transferNet(i), dst, "/files/"+smallFile, add) })
		}
		wg.Wait()
		err = errors.Join(errs...)
	}
	return run.result(res, err), nil
}

// download fetches path over a new connection from src.
func download(ctx context.Context, src netip.Addr, dst netip.AddrPort, path string, progress func(int)) error {
	h, err := dialH3(ctx, src, dst)
	if err != nil {
		return err
	}
	defer h.close()
	_, err = h.get(ctx, path, "", progress)
	return err
}

// upload POSTs size bytes to /upload over a new connection from src; the
// backend counts what arrives.
func upload(ctx context.Context, src netip.Addr, dst netip.AddrPort, id string, size int64) error {
	h, err := dialH3(ctx, src, dst)
	if err != nil {
		return err
	}
	defer h.close()
	body := io.LimitReader(newPatternReader(), size)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost,
		fmt.Sprintf("https://localhost:%d/upload?id=%s", dst.Port(), id), body)
	if err != nil {
		return err
	}
	req.ContentLength = size
	resp, err := h.cc.RoundTrip(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	reply, err := io.ReadAll(io.LimitReader(resp.Body, 100))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("upload: status %s", resp.Status)
	}
	if n, err := strconv.ParseInt(string(reply), 10, 64); err != nil || n != size {
		return fmt.Errorf("upload: the backend read %q bytes, want %d", reply, size)
	}
	return nil
}

// patternReader is an endless stream of a repeated random block.
type patternReader struct {
	block []byte
	off   int
}

func newPatternReader() *patternReader {
	b := make([]byte, 64<<10)
	rand.NewChaCha8([32]byte{2}).Read(b)
	return &patternReader{block: b}
}

func (p *patternReader) Read(b []byte) (int, error) {
	n := 0
	for n < len(b) {
		c := copy(b[n:], p.block[p.off:])
		n += c
		p.off = (p.off + c) % len(p.block)
	}
	return n, nil
}
