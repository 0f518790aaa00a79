// Package console is the operator's terminal view of a running rakelimit:
// it fetches the admin view (GET /rakelimit/ on Caddy's admin endpoint) and
// decodes it into the type the admin API encodes, the limiters' report
// (package report), turns two snapshots into rates, and renders one screen
// with a one-line verdict per limiter. The caddy rakelimit status and top
// commands are thin wrappers around it; nothing here needs a running Caddy.
package console

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/engine/report"
)

// Fetcher reads the admin view; Client.Fetch is one.
type Fetcher func(context.Context) (report.View, error)

// Options are what Status and Top need besides the fetcher.
type Options struct {
	// Address names the admin endpoint in the title.
	Address string
	// Interval is the time between two snapshots: the rates' period for
	// Status, the refresh period for Top.
	Interval time.Duration
	// Terminal is true when Out is a terminal: Top then clears it before
	// each screen; otherwise each screen follows the last as plain text.
	Terminal bool
	// Size returns the terminal's columns and lines (0, 0: unbounded).
	Size func() (int, int)
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

func (o Options) now() time.Time {
	if o.Now != nil {
		return o.Now()
	}
	return time.Now()
}

func (o Options) size() (int, int) {
	if o.Size != nil {
		return o.Size()
	}
	return 0, 0
}

// Status reads the view twice, Interval apart, and writes one screen.
func Status(ctx context.Context, fetch Fetcher, out io.Writer, o Options) error {
	first, err := fetch(ctx)
	if err != nil {
		return err
	}
	prev := Snapshot{At: o.now(), View: first}
	select {
	case <-ctx.Done():
		return nil
	case <-time.After(o.Interval):
	}
	cur, err := fetch(ctx)
	if err != nil {
		return err
	}
	w, h := o.size()
	return Render(out, Screen{Address: o.Address, Prev: &prev, Cur: Snapshot{At: o.now(), View: cur}, Width: w, Height: h})
}

// ANSI escapes of the live view: cursor home and clear the screen, hide
// and show the cursor.
const (
	clearScreen = "\x1b[H\x1b[2J"
	hideCursor  = "\x1b[?25l"
	showCursor  = "\x1b[?25h"
)

// Top writes a screen every Interval until ctx ends, then returns nil. The
// first read's error is returned; later ones are shown in place of the
// screen while it keeps trying (Caddy may be reloading).
func Top(ctx context.Context, fetch Fetcher, out io.Writer, o Options) error {
	v, err := fetch(ctx)
	if err != nil {
		return err
	}
	if o.Terminal {
		fmt.Fprint(out, hideCursor)
		defer fmt.Fprint(out, showCursor)
	}
	var prev *Snapshot
	cur := Snapshot{At: o.now(), View: v}
	tick := time.NewTicker(o.Interval)
	defer tick.Stop()
	for {
		w, h := o.size()
		if o.Terminal {
			fmt.Fprint(out, clearScreen)
		} else {
			w, h = 0, 0
		}
		var lines []string
		if err != nil {
			lines = []string{fmt.Sprintf("rakelimit at %s, %s: %v", o.Address, o.now().Format("15:04:05"), err)}
		} else {
			lines = Lines(Screen{Address: o.Address, Prev: prev, Cur: cur, Width: w, Height: h})
		}
		for i, l := range lines {
			if i > 0 {
				fmt.Fprint(out, "\n")
			}
			fmt.Fprint(out, l)
		}
		if !o.Terminal {
			fmt.Fprint(out, "\n\n")
		}
		select {
		case <-ctx.Done():
			if o.Terminal {
				fmt.Fprint(out, "\n")
			}
			return nil
		case <-tick.C:
		}
		var v report.View
		if v, err = fetch(ctx); err == nil {
			p := cur
			prev = &p
			cur = Snapshot{At: o.now(), View: v}
		} else if ctx.Err() != nil {
			return nil
		}
	}
}
