package filterbench

import (
	"bytes"
	"math"
	"slices"
	"strings"
	"testing"
)

func TestMedian(t *testing.T) {
	for _, tt := range []struct {
		name string
		in   []float64
		want float64
	}{
		{"one", []float64{7}, 7},
		{"odd, unsorted", []float64{9, 1, 5}, 5},
		{"even: mean of the middle two", []float64{4, 1, 3, 2}, 2.5},
		{"an outlier does not move it", []float64{100, 101, 99, 1e9, 100}, 100},
	} {
		t.Run(tt.name, func(t *testing.T) {
			in := slices.Clone(tt.in)
			if got := median(in); got != tt.want {
				t.Errorf("median(%v) = %v, want %v", tt.in, got, tt.want)
			}
			if !slices.Equal(in, tt.in) {
				t.Errorf("median reordered its input: %v", in)
			}
		})
	}
	if got := median(nil); !math.IsNaN(got) {
		t.Errorf("median(nil) = %v, want NaN", got)
	}
}

func TestFormatting(t *testing.T) {
	for _, tt := range []struct {
		ns   float64
		want string
	}{
		{0, "0 ns"}, {26.4, "26 ns"}, {999.5, "1,000 ns"}, {1193, "1,193 ns"},
		{1234567, "1,234,567 ns"}, {-1500, "-1,500 ns"}, {math.NaN(), "—"},
	} {
		if got := nanos(tt.ns); got != tt.want {
			t.Errorf("nanos(%v) = %q, want %q", tt.ns, got, tt.want)
		}
	}
	for _, tt := range []struct {
		row  Row
		want string
	}{
		{Row{Ours: 273, Cloudflare: 299}, "0.91"},
		{Row{Ours: 1193, Cloudflare: 447}, "2.67"},
		{Row{Ours: 100, Cloudflare: math.NaN()}, "—"},
		{Row{Ours: 100, Cloudflare: 0}, "—"},
	} {
		if got := ratio(tt.row.Ratio()); got != tt.want {
			t.Errorf("ratio of %+v = %q, want %q", tt.row, got, tt.want)
		}
	}
}

func testReport() *Report {
	return &Report{CPU: "AMD EPYC", Kernel: "6.18.0", Cloudflare: CloudflareModule + "@" + CloudflareVersion,
		Rounds: 15, Repeat: 200_000, Once: 2_000, LeadIn: 1_500, Clock: ClockKernel,
		Rows: []Row{
			{Key: "ipv4-under", Case: "one source, under the limit", Ours: 273, Cloudflare: 299, Floor: 26},
			{Key: "ipv4-random-switch", Case: "switch", Ours: 427, Cloudflare: math.NaN(), Floor: 27},
			{Key: "ipv4-random", Case: "new sources", Ours: 300, Cloudflare: 400, Floor: 60,
				NewSources: true, OursDropped: 0.9951, CloudflareDropped: math.NaN()},
		}}
}

func TestMarkdown(t *testing.T) {
	md := testReport().Markdown()
	for _, want := range []string{
		"CPU: AMD EPYC; kernel 6.18.0",
		CloudflareModule + "@" + CloudflareVersion,
		"15 interleaved rounds",
		"| case | this filter | Cloudflare's | ratio | floor program |",
		"| one source, under the limit | 273 ns | 299 ns | 0.91 | 26 ns |",
		"| switch | 427 ns | — | — | 27 ns |",
		"first runs 1,500 frames from other new sources",
		"- new sources: this filter dropped 99.5% of the timed packets, Cloudflare's —",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("the Markdown lacks %q:\n%s", want, md)
		}
	}
	// Every table line has as many cells as the header.
	for _, l := range strings.Split(md, "\n") {
		if strings.HasPrefix(l, "|") && strings.Count(l, "|") != len(header)+1 {
			t.Errorf("table line with %d separators, want %d: %q", strings.Count(l, "|"), len(header)+1, l)
		}
	}
}

func TestWriteText(t *testing.T) {
	var b bytes.Buffer
	if err := testReport().WriteText(&b); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 6 {
		t.Fatalf("%d lines, want the CPU, the header, 3 rows and the new sources' drops:\n%s", len(lines), b.String())
	}
	if want := "- new sources: this filter dropped 99.5%"; !strings.HasPrefix(lines[5], want) {
		t.Errorf("last line %q, want it to start %q", lines[5], want)
	}
	if !strings.HasPrefix(lines[0], "CPU: AMD EPYC;") {
		t.Errorf("first line %q, want the CPU model", lines[0])
	}
	// Aligned: every row's second column starts where the header's does.
	col := strings.Index(lines[1], "this filter")
	for _, l := range lines[2:5] {
		if col >= len(l) || l[col-1] != ' ' || l[col] == ' ' {
			t.Errorf("row not aligned at column %d: %q", col, l)
		}
	}
}

func TestCPUModel(t *testing.T) {
	for _, tt := range []struct {
		name, cpuinfo, want string
	}{
		{"x86", "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\nprocessor\t: 1\nmodel name\t: AMD EPYC 7B13\n", "AMD EPYC 7B13"},
		{"arm64", "processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\nCPU part\t: 0xd0c\n", "CPU part 0xd0c"},
		{"empty model name", "model name\t:\nCPU part\t: 0xd0c\n", "CPU part 0xd0c"},
		{"nothing", "", "unknown"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := CPUModel(strings.NewReader(tt.cpuinfo)); got != tt.want {
				t.Errorf("CPUModel = %q, want %q", got, tt.want)
			}
		})
	}
}
