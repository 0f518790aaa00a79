package engine

import "fmt"

// Accepts reports why the running limiter cannot take s (its
// configuration, the mode asked for and the options) at the next Put, or
// nil: the sketches are laid out for the number of prefixes and
// per_destination_port of the engine running, the engine's mode changes
// only with a restart (a chain keeps the one of its modes running), and so
// do the options. s.Config is validated already: Accepts checks only what
// a running limiter adds, and compiles nothing.
func (l *Limiter) Accepts(s Setting) error {
	l.mu.Lock()
	eng, running := l.eng, l.put.Options
	l.mu.Unlock()
	if !eng.Params().Takes(s.Config.Limiter) {
		return fmt.Errorf("rakelimit %q: the number of prefixes and per_destination_port cannot change "+
			"while its listeners run; restart Caddy, or use a new name on a new listener address", l.name)
	}
	if mode := eng.Mode(); !Runs(s.Mode, mode) {
		return fmt.Errorf("rakelimit %q runs in %s mode, and mode %s cannot take over its running listeners; "+
			"restart Caddy to change the mode (mode auto keeps the one running)", l.name, mode, s.Mode)
	}
	if !running.Equal(s.Options) {
		return fmt.Errorf("rakelimit %q runs with xdp_interfaces %v and xdp_generic %v, which cannot change while its "+
			"listeners run (asked: %v and %v); restart Caddy to change them", l.name, running.XDPInterfaces,
			running.XDPGeneric, s.Options.XDPInterfaces, s.Options.XDPGeneric)
	}
	return nil
}
