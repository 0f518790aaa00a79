package engine

import (
	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
)

// start runs the limiter on eng, opened by the test, as NewWith does on
// the engine it opens: the controllers of the adaptive totals start on
// put's configuration (steered).
func start(name string, eng Engine, put Setting, open func(Mode, decide.Config, *sketch.HashKey) (Engine, error)) (*Limiter, error) {
	_, totals := steered(put.Config, decide.Config{}, adaptiveTotals{})
	return startWith(name, eng, put, totals, open)
}
