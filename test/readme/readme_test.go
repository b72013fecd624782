//go:build integration

package readme

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// block is one fenced code block of a Markdown file.
type block struct {
	line   int    // of the opening fence, 1-based
	lang   string // the fence's info string
	text   string
	marker string // the one-line HTML comment right before the block (blank lines between allowed), without <!-- -->
}

var commentLine = regexp.MustCompile(`^<!--\s*(.*?)\s*-->$`)

// blocks returns the fenced code blocks of md in order.
func blocks(md string) ([]block, error) {
	var out []block
	var cur *block
	var body strings.Builder
	prev := "" // the last non-blank line outside a block
	sc := bufio.NewScanner(strings.NewReader(md))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur == nil && strings.HasPrefix(line, "```"):
			cur = &block{line: n, lang: strings.TrimSpace(strings.TrimPrefix(line, "```"))}
			if m := commentLine.FindStringSubmatch(prev); m != nil {
				cur.marker = m[1]
			}
			body.Reset()
		case cur != nil && strings.TrimSpace(line) == "```":
			cur.text = body.String()
			out = append(out, *cur)
			cur, prev = nil, line
		case cur != nil:
			body.WriteString(line + "\n")
		case strings.TrimSpace(line) != "":
			prev = strings.TrimSpace(line)
		}
	}
	if cur != nil {
		return nil, fmt.Errorf("line %d: the block never ends", cur.line)
	}
	return out, sc.Err()
}

// marker is what the comment before a block asks for (see the package documentation).
type marker struct {
	needs   string   // not run here: what it needs
	covered []string // ... and the tests that cover it
	ready   string   // a daemon: the URL that answers 200 once it is ready
}

var (
	needsMarker  = regexp.MustCompile(`^needs: (.+), covered by (Test\w+(?:, Test\w+)*)$`)
	daemonMarker = regexp.MustCompile(`^daemon: ready at (http://127\.0\.0\.1:\d+/\S*)$`)
)

func parseMarker(s string) (marker, error) {
	if s == "" {
		return marker{}, nil
	}
	if m := needsMarker.FindStringSubmatch(s); m != nil {
		return marker{needs: m[1], covered: strings.Split(m[2], ", ")}, nil
	}
	if m := daemonMarker.FindStringSubmatch(s); m != nil {
		return marker{ready: m[1]}, nil
	}
	return marker{}, fmt.Errorf("the comment before it, %q, is neither %q nor %q", s,
		"needs: WHAT, covered by TestName[, TestOther]", "daemon: ready at http://127.0.0.1:PORT/PATH")
}

// testNames lists the Test functions of every _test.go file in the repository, whatever its build tags.
func testNames(t *testing.T) map[string]bool {
	t.Helper()
	decl := regexp.MustCompile(`(?m)^func (Test\w+)\(t \*testing\.T\)`)
	names := map[string]bool{}
	err := filepath.WalkDir(repoRoot, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == ".cache" || d.Name() == "bin" || d.Name() == "_demo") {
			return filepath.SkipDir
		}
		if !strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range decl.FindAllSubmatch(b, -1) {
			names[string(m[1])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// checkout makes dir look like a checkout of the repository for the README's commands: every top-level
// entry linked, and bin/konnect the binary built from this tree.
func checkout(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		switch e.Name() {
		case ".git", "bin", "_demo", ".cache":
			continue
		}
		if err := os.Symlink(filepath.Join(repoRoot, e.Name()), filepath.Join(dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(konnectBin, filepath.Join(dir, "bin", "konnect")); err != nil {
		t.Fatal(err)
	}
}

// chosenPath is a path the README tells the reader to choose: one under /tmp/.
var chosenPath = regexp.MustCompile(`(^|[\s='"])/tmp/`)

// lockREADME keeps two runs of the README (by two test processes) apart: its daemons use fixed ports.
func lockREADME(t *testing.T) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "konnect-readme.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
}

// TestREADME runs every ```sh block of README.md in order, or checks that the tests it names as covering it
// exist (see the package documentation).
func TestREADME(t *testing.T) {
	md, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	all, err := blocks(string(md))
	if err != nil {
		t.Fatalf("README.md: %v", err)
	}
	lockREADME(t)
	// Short: a socket path under it must fit in 107 bytes.
	work, err := os.MkdirTemp("", "kn-rd-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(work) })
	tree, tmp, home := filepath.Join(work, "tree"), filepath.Join(work, "tmp"), filepath.Join(work, "home")
	for _, d := range []string{tree, tmp, home} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	checkout(t, tree)
	env := cleanEnv(t, home)
	tests := testNames(t)

	var daemons []*daemon
	t.Cleanup(func() {
		for i := len(daemons) - 1; i >= 0; i-- {
			daemons[i].stop(t)
		}
	})
	ran, covered := 0, 0
	for _, b := range all {
		if b.lang != "sh" {
			if b.marker != "" {
				t.Errorf("README.md:%d: a %q block has a marker %q; only sh blocks run", b.line, b.lang, b.marker)
			}
			continue
		}
		m, err := parseMarker(b.marker)
		if err != nil {
			t.Fatalf("README.md:%d: %v", b.line, err)
		}
		if m.needs != "" {
			for _, name := range m.covered {
				if !tests[name] {
					t.Errorf("README.md:%d: the block needs %s and names %s as covering it, but no test of that name exists", b.line, m.needs, name)
				}
			}
			covered++
			continue
		}
		script := chosenPath.ReplaceAllString(b.text, "${1}"+tmp+"/")
		if m.ready != "" {
			d, err := startDaemon(t, b, script, tree, env, m.ready)
			if d != nil {
				daemons = append(daemons, d)
			}
			if err != nil {
				t.Fatalf("README.md:%d: %v\n%s", b.line, err, script)
			}
			ran++
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
		cmd.Dir, cmd.Env = tree, env
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("README.md:%d: %v\n$ %s\n%s", b.line, err, strings.ReplaceAll(strings.TrimSpace(script), "\n", "\n$ "), out)
		}
		t.Logf("README.md:%d ran:\n%s", b.line, out)
		ran++
	}
	if ran == 0 {
		t.Fatal("README.md has no block that runs")
	}
	t.Logf("README.md: %d blocks ran, %d are covered by the tests they name", ran, covered)
}

// daemon is a README block that keeps running.
type daemon struct {
	line   int
	cmd    *exec.Cmd
	out    *bytes.Buffer
	exited chan error
}

// startDaemon runs a block holding one long-running command in the background and waits for ready to
// answer 200.
func startDaemon(t *testing.T, b block, script, dir string, env []string, ready string) (*daemon, error) {
	t.Helper()
	if n := commands(script); n != 1 {
		return nil, fmt.Errorf("a daemon block must hold one command, not %d", n)
	}
	d := &daemon{line: b.line, out: &bytes.Buffer{}, exited: make(chan error, 1)}
	// exec: the daemon itself gets the SIGTERM of stop, as in a terminal.
	d.cmd = exec.Command("bash", "-euo", "pipefail", "-c", "exec "+strings.TrimSpace(script))
	d.cmd.Dir, d.cmd.Env = dir, env
	d.cmd.Stdout, d.cmd.Stderr = d.out, d.out
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := d.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { d.exited <- d.cmd.Wait() }()
	client := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 2 * time.Second}
	deadline := time.Now().Add(time.Minute)
	for {
		select {
		case err := <-d.exited:
			d.exited <- err
			return d, fmt.Errorf("exited before it was ready at %s: %v\n%s", ready, err, d.out)
		default:
		}
		if res, err := client.Get(ready); err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				t.Logf("README.md:%d is ready at %s", b.line, ready)
				return d, nil
			}
		}
		if time.Now().After(deadline) {
			return d, fmt.Errorf("not ready at %s within a minute\n%s", ready, d.out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop sends SIGTERM, as Ctrl-C in its terminal would, and expects a clean exit.
func (d *daemon) stop(t *testing.T) {
	select {
	case err := <-d.exited:
		t.Errorf("README.md:%d: the daemon exited before the end of the README: %v\n%s", d.line, err, d.out)
		return
	default:
	}
	_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case err := <-d.exited:
		if err != nil {
			t.Errorf("README.md:%d: the daemon exited with %v on SIGTERM, want 0\n%s", d.line, err, d.out)
		}
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
		<-d.exited
		t.Errorf("README.md:%d: the daemon did not exit within 30s of SIGTERM\n%s", d.line, d.out)
	}
	if t.Failed() {
		t.Logf("README.md:%d output:\n%s", d.line, d.out)
	}
}

// commands counts the commands of a script: its lines, with continuation lines joined, blank lines and
// comments left out.
func commands(script string) int {
	n := 0
	for _, line := range strings.Split(strings.ReplaceAll(script, "\\\n", " "), "\n") {
		if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
			n++
		}
	}
	return n
}

// The parser and the markers, on a README of its own.
func TestBlocksAndMarkers(t *testing.T) {
	md := "text\n\n<!-- needs: a cluster, covered by TestNodes, TestLaptop -->\n```sh\nkubectl get pods\n```\n" +
		"<!-- daemon: ready at http://127.0.0.1:8134/readyz -->\n\n```sh\nbin/konnect server \\\n  --mode grpc\n```\n" +
		"```yaml\na: 1\n```\n<!-- a remark -->\nmore text\n```sh\necho hi\n```\n"
	bs, err := blocks(md)
	if err != nil {
		t.Fatal(err)
	}
	if len(bs) != 4 {
		t.Fatalf("%d blocks: %+v", len(bs), bs)
	}
	for i, want := range []struct {
		line         int
		lang, marker string
	}{
		{4, "sh", "needs: a cluster, covered by TestNodes, TestLaptop"},
		{9, "sh", "daemon: ready at http://127.0.0.1:8134/readyz"},
		{13, "yaml", ""},
		{18, "sh", ""}, // a comment followed by text is not a marker
	} {
		if bs[i].line != want.line || bs[i].lang != want.lang || bs[i].marker != want.marker {
			t.Errorf("block %d: %+v, want %+v", i, bs[i], want)
		}
	}
	if m, err := parseMarker(bs[0].marker); err != nil || m.needs != "a cluster" || strings.Join(m.covered, ",") != "TestNodes,TestLaptop" {
		t.Errorf("needs marker: %+v, %v", m, err)
	}
	if m, err := parseMarker(bs[1].marker); err != nil || m.ready != "http://127.0.0.1:8134/readyz" || commands(bs[1].text) != 1 {
		t.Errorf("daemon marker: %+v, %v, %d commands", m, err, commands(bs[1].text))
	}
	for _, bad := range []string{"needs: a cluster", "need: a cluster, covered by TestNodes", "needs: a cluster, covered by nothing",
		"daemon: ready at http://198.18.0.1:8134/readyz", "skip"} {
		if _, err := parseMarker(bad); err == nil {
			t.Errorf("marker %q accepted", bad)
		}
	}
	if got := chosenPath.ReplaceAllString("cp a /tmp/x/y --dir=/tmp/z '/tmp/q' /tmpfoo a/tmp/b", "${1}/W/"); got != "cp a /W/x/y --dir=/W/z '/W/q' /tmpfoo a/tmp/b" {
		t.Errorf("rewritten: %q", got)
	}
	if _, err := blocks("```sh\necho\n"); err == nil {
		t.Error("an unterminated block is accepted")
	}
}
