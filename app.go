package rakelimit

import (
	"errors"

	"github.com/caddyserver/caddy/v2"
)

// App commits the settings of rakelimit wrappers to live filters when a
// configuration starts. Caddy provisions a new configuration while the old
// one still runs, and may still abandon it; so a wrapper whose filter already
// serves a socket does not change it in Provision, it queues the change here,
// and Start applies it once the configuration is sure to run. If a later app
// fails to start, Caddy stops this one, and Stop puts the previous settings
// back. Wrappers load the app themselves; it has nothing to configure.
type App struct {
	commits []commit
	started []commit
}

// commit is one queued change: apply puts it in force; revert undoes it if
// nothing newer has replaced it since.
type commit struct {
	apply  func() error
	revert func()
}

// CaddyModule returns the Caddy module information.
func (App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "rakelimit",
		New: func() caddy.Module { return new(App) },
	}
}

// queue adds a change to apply when the configuration starts.
func (a *App) queue(c commit) { a.commits = append(a.commits, c) }

// Start applies the queued changes, or none of them.
func (a *App) Start() error {
	for _, c := range a.commits {
		if err := c.apply(); err != nil {
			a.Stop()
			return err
		}
		a.started = append(a.started, c)
	}
	return nil
}

// Stop reverts the changes this configuration applied, unless newer ones
// have replaced them: that restores the previous settings when a reload is
// abandoned after this app started.
func (a *App) Stop() error {
	for i := len(a.started) - 1; i >= 0; i-- {
		a.started[i].revert()
	}
	a.started = nil
	return nil
}

// loadApp returns the rakelimit app of the configuration being provisioned.
func loadApp(ctx caddy.Context) (*App, error) {
	v, err := ctx.App("rakelimit")
	if err != nil {
		return nil, err
	}
	a, ok := v.(*App)
	if !ok {
		return nil, errors.New("the rakelimit app has an unexpected type")
	}
	return a, nil
}

// Interface guards
var (
	_ caddy.App = (*App)(nil)
)
