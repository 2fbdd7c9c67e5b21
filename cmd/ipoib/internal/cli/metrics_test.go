package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/ipoibcm/ipoib/control"
	"github.com/ipoibcm/ipoib/hca/rocev2"
	"github.com/ipoibcm/ipoib/metrics"
)

// scrapeValue fetches /metrics and returns the value of the series whose
// line starts with series (name and labels, exactly as exposed).
func scrapeValue(t *testing.T, url, series string) float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("%s: %v", l, err)
			}
			return f
		}
	}
	t.Fatalf("scrape has no %s:\n%s", series, body)
	return 0
}

// TestMetricsMatchShowJSON scrapes the metrics of two 'ipoib up' hosts
// after traffic and checks the counters against what 'ipoib show --json'
// reports for the same hosts.
func TestMetricsMatchShowJSON(t *testing.T) {
	p := newUpPair(t, rocev2.Faults{})
	m := metrics.New()
	for _, h := range p.ups {
		m.Add(metrics.Source{Host: h.name, Stats: h.ifc.Stats})
	}
	srv, err := metrics.Serve("127.0.0.1:0", m, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	dir := t.TempDir()
	ctl, err := control.Listen(dir, []control.Endpoint{p.ups[0], p.ups[1]}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	for range 5 {
		p.ping(t, 0, 1000)
	}
	show := func() map[string]map[string]any {
		var stdout, stderr bytes.Buffer
		code := Main(context.Background(), []string{"show", "--json"}, Env{ControlDir: dir, Stdout: &stdout, Stderr: &stderr})
		out := stdout.String()
		if code != 0 {
			t.Fatalf("show --json exit %d: %s", code, stderr.String())
		}
		var all []struct {
			Interface control.InterfaceInfo `json:"interface"`
			Stats     map[string]any        `json:"stats"`
		}
		if err := json.Unmarshal([]byte(out), &all); err != nil {
			t.Fatalf("show --json: %v\n%s", err, out)
		}
		byHost := map[string]map[string]any{}
		for _, s := range all {
			byHost[s.Interface.Host] = s.Stats
		}
		return byHost
	}
	url := "http://" + srv.Addr().String() + "/metrics"
	host := p.ups[1].name
	before := show()
	scraped := scrapeValue(t, url, `ipoib_rx_packets_total{host="`+host+`"}`)
	connects := scrapeValue(t, url, `ipoib_reaper_rx_accepted_total{host="`+host+`"}`)
	after := show()
	lo := before[host]["counters"].(map[string]any)["rx_packets"].(float64)
	hi := after[host]["counters"].(map[string]any)["rx_packets"].(float64)
	if lo < 5 || scraped < lo || scraped > hi {
		t.Fatalf("ipoib_rx_packets_total %v, show --json rx_packets %v then %v", scraped, lo, hi)
	}
	acc := after[host]["reaper"].(map[string]any)["rx_accepted"].(float64)
	if connects != acc || acc < 1 {
		t.Fatalf("ipoib_reaper_rx_accepted_total %v, show --json reaper.rx_accepted %v", connects, acc)
	}
	t.Logf("%s: rx_packets metric %v, show %v..%v; rx_accepted %v", host, scraped, lo, hi, acc)
}
