package rakelimit

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/rakelimit/caddy-rakelimit/internal/console"
	"github.com/rakelimit/caddy-rakelimit/internal/engine"
	"github.com/rakelimit/caddy-rakelimit/internal/engine/report"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// TestConsoleReadsAdminView checks that the console reads every field the
// admin view serves: the admin API's JSON of a running limiter decodes,
// strictly, into the report the console reads, and encodes back the same;
// and the console's client fetches it.
func TestConsoleReadsAdminView(t *testing.T) {
	reg := engine.NewRegistry()
	l, err := reg.Start("default", testutil.QUICLimits(100, 1000), engine.ModeUserspace, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close(l) })
	admin := Admin{registry: reg}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := admin.serve(w, r); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	}))
	t.Cleanup(srv.Close)
	resp, err := http.Get(srv.URL + console.Path)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s %v", console.Path, resp.StatusCode, b, err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var got report.View
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("the console cannot read the admin view: %v\n%s", err, b)
	}
	again, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again, bytes.TrimSpace(b)) {
		t.Errorf("the console's view differs from the admin's:\n%s\n%s", again, b)
	}
	if len(got.Limiters) != 1 || got.Limiters[0].Mode != engine.ModeUserspace || got.Limiters[0].Prefilter == nil ||
		got.Limiters[0].Config.Window != report.Duration(time.Second) {
		t.Errorf("admin view %s: want the userspace limiter with its pre-filter and a window of 1s", b)
	}
	client := console.Client{Address: strings.TrimPrefix(srv.URL, "http://"), Origin: srv.URL, HTTP: srv.Client()}
	if v, err := client.Fetch(context.Background()); err != nil || len(v.Limiters) != 1 || v.Limiters[0].Name != "default" {
		t.Errorf("the console fetched %+v, %v", v, err)
	}
}
