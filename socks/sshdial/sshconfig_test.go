package sshdial

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
)

// writeConfig writes an SSH config file of the user's (mode 0600) at dir/name, making its directory, and
// returns its path.
func writeConfig(t *testing.T, dir, name, content string) string {
	t.Helper()
	f := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(f), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestParseMatch: a Match line's criteria are read as OpenSSH reads them, quotes and "!" included, and a line
// OpenSSH refuses is refused.
func TestParseMatch(t *testing.T) {
	for _, tc := range []struct {
		line string
		want []matchCriterion
		err  string
	}{
		{"Match all", []matchCriterion{{name: "all"}}, ""},
		{"Match=host *.corp,!bad.corp User admin", []matchCriterion{{name: "host", arg: "*.corp,!bad.corp"}, {name: "user", arg: "admin"}}, ""},
		{`  match !originalhost b* exec "test -e /x # y" # comment`, []matchCriterion{{negate: true, name: "originalhost", arg: "b*"}, {name: "exec", arg: "test -e /x # y"}}, ""},
		{"Match canonical final localuser root", []matchCriterion{{name: "canonical"}, {name: "final"}, {name: "localuser", arg: "root"}}, ""},
		{"Match localnetwork 10.0.0.0/8", []matchCriterion{{name: "localnetwork", arg: "10.0.0.0/8"}}, ""},
		{"Match canonical all", []matchCriterion{{name: "canonical"}, {name: "all"}}, ""},
		{"Match exec 'test -e \"/a b\"'", []matchCriterion{{name: "exec", arg: `test -e "/a b"`}}, ""},
		{"Match", nil, "Match needs at least one criterion"},
		{"Match # nothing", nil, "Match needs at least one criterion"},
		{"Match host", nil, "Match: host needs an argument"},
		{"Match all host x", nil, `"all" cannot be combined`},
		{"Match host x user y all", nil, `"all" cannot be combined`},
		{"Match hots x", nil, `unknown criterion "hots"`},
		{`Match exec "true`, nil, "unterminated quote"},
	} {
		t.Run(tc.line, func(t *testing.T) {
			dir := t.TempDir()
			f := filepath.Join(dir, "config")
			os.WriteFile(f, []byte("Host a\n  User u\n"+tc.line+"\n  Port 2\n"), 0o600)
			cf, err := readConfigFile(f, false, false, 0, new(configBudget))
			if tc.err != "" {
				// The error names the file and the line, as OpenSSH's does.
				if want := f + " line 3: "; err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q and %q", err, want, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []matchCriterion
			for _, l := range cf.lines {
				if l.kind == matchLine {
					if l.line != 3 {
						t.Errorf("Match read at line %d, want 3", l.line)
					}
					got = l.match
				}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("criteria %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestMatchExecRunsOnlyIfTheCriteriaBeforeItHold: as in OpenSSH, an exec after a criterion that does not hold
// is not run; one after criteria that hold is, with its tokens expanded.
func TestMatchExecRunsOnlyIfTheCriteriaBeforeItHold(t *testing.T) {
	dir := t.TempDir()
	skipped, ran := filepath.Join(dir, "skipped"), filepath.Join(dir, "ran")
	cfgFile := filepath.Join(dir, "config")
	os.WriteFile(cfgFile, []byte(`Host tgt
  HostName 192.0.2.1
Match host other exec "touch `+skipped+`"
  Port 2200
Match host 192.0.2.1 exec "echo %h %n %p %r > `+ran+`"
  User matched
`), 0o600)
	p, err := resolve(Config{Destination: "tgt", ConfigFile: cfgFile})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(skipped); err == nil {
		t.Error("Match exec ran after a criterion that does not hold")
	}
	if b, err := os.ReadFile(ran); err != nil || string(b) != "192.0.2.1 tgt 22 "+localUser()+"\n" {
		t.Errorf("Match exec after criteria that hold wrote %q (%v)", b, err)
	}
	if tg := p.hops[0]; tg.user != "matched" || tg.port != 22 {
		t.Errorf("target %+v", tg)
	}
}

// TestMatchBlocks: Match blocks apply as OpenSSH applies them (the oracle test compares with ssh -G); a
// block that depends on a criterion konnect does not evaluate is skipped with a warning naming its file
// and line; a Match exec that cannot run, or an unknown token, fails the start naming them.
func TestMatchBlocks(t *testing.T) {
	dir := t.TempDir()
	setHome(t, dir)
	t.Setenv("SHELL", "/bin/sh") // for "kill -9 $$"
	write := func(name, content string) string { return writeConfig(t, dir, name, content) }
	inc := write("inc.conf", "Port 2300\nMatch user root,matched\n  IdentityFile /k/included\n")
	cfgFile := write("config", `Host tgt
  HostName 192.0.2.1
Match host 192.0.2.1 !originalhost 192.0.2.1
  User matched
Match localnetwork 10.0.0.0/8
  ProxyJump jumpy
Match host nomatch localnetwork 10.0.0.0/8
  ProxyJump jumpy2
Match originalhost tgt
  Include `+inc+`
Match all
  ServerAliveCountMax 9
`)
	var logged []string
	log := funcr.New(func(prefix, args string) { logged = append(logged, args) }, funcr.Options{})
	p, err := resolve(Config{Destination: "tgt", ConfigFile: cfgFile, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	tg := p.hops[len(p.hops)-1]
	if len(p.hops) != 1 || tg.user != "matched" || tg.port != 2300 || tg.hostName != "192.0.2.1" {
		t.Errorf("hops %+v", p.hops)
	}
	if !reflect.DeepEqual(tg.identity, []string{"/k/included"}) {
		t.Errorf("identity %v: the Match block of the included file did not apply", tg.identity)
	}
	if p.aliveCountMax != 9 {
		t.Errorf("ServerAliveCountMax %d: Match all did not apply", p.aliveCountMax)
	}
	if len(logged) != 1 || !strings.Contains(logged[0], cfgFile) || !strings.Contains(logged[0], `"line"=5`) || !strings.Contains(logged[0], "localnetwork") {
		t.Errorf("want one warning, for line 5; logged:\n%s", strings.Join(logged, "\n"))
	}

	for _, tc := range []struct{ config, err string }{
		{"Match exec \"kill -9 $$\"\n", `line 1: Match exec: "kill -9 $$"`},
		{"Host tgt\n  User u\nMatch exec \"test %z\"\n", `line 3: Match exec: "test %z": unknown token %z`},
	} {
		f := write("bad", tc.config)
		if _, err := resolve(Config{Destination: "tgt", ConfigFile: f}); err == nil || !strings.Contains(err.Error(), f+" "+tc.err) {
			t.Errorf("err = %v, want %q", err, f+" "+tc.err)
		}
	}
}

// TestUnevaluatedMatchWarnedOnce: the warning for a Match block konnect cannot evaluate is logged once per
// file and line, though the block is read for every hop and again in the final pass.
func TestUnevaluatedMatchWarnedOnce(t *testing.T) {
	cfgFile := writeConfig(t, t.TempDir(), "config", `Host tgt
  ProxyJump gate
Match localnetwork 10.0.0.0/8
  Port 2300
Match final
  User u
Match tagged x
  Port 2400
`)
	var logged []string
	log := funcr.New(func(prefix, args string) { logged = append(logged, args) }, funcr.Options{})
	p, err := resolve(Config{Destination: "tgt", ConfigFile: cfgFile, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.hops) != 2 {
		t.Fatalf("hops %+v, want gate and tgt", p.hops)
	}
	if len(logged) != 2 || !strings.Contains(logged[0], `"line"=3`) || !strings.Contains(logged[1], `"line"=7`) {
		t.Errorf("want one warning for line 3 and one for line 7; logged:\n%s", strings.Join(logged, "\n"))
	}
}

// TestIncludedProxyJumpAndProxyCommand: an included file is read in line order, so of ProxyJump and
// ProxyCommand set in it the first line read applies, as in ssh, where konnect could not tell before.
func TestIncludedProxyJumpAndProxyCommand(t *testing.T) {
	dir := t.TempDir()
	inc := filepath.Join(dir, "inc.conf")
	os.WriteFile(inc, []byte("Host tgt\n  ProxyCommand nc %h %p\n  ProxyJump jumpy\n"), 0o600)
	cfgFile := filepath.Join(dir, "config")
	os.WriteFile(cfgFile, []byte("Include "+inc+"\n"), 0o600)
	p, err := resolve(Config{Destination: "tgt", ConfigFile: cfgFile})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.hops) != 1 || p.hops[0].proxyCommand != "nc tgt 22" {
		t.Errorf("hops %+v, want tgt through ProxyCommand nc tgt 22", p.hops)
	}
}

// TestRelativeIncludeIsUnderSSHDir: as in OpenSSH, a relative Include path is under ~/.ssh, and ~ is the
// passwd entry's home directory, whatever $HOME says.
func TestRelativeIncludeIsUnderSSHDir(t *testing.T) {
	home := t.TempDir()
	setHome(t, home)
	t.Setenv("HOME", t.TempDir())
	os.MkdirAll(filepath.Join(home, ".ssh", "conf.d"), 0o700)
	os.WriteFile(filepath.Join(home, ".ssh", "conf.d", "a.conf"), []byte("Host h\n  User from-relative\n"), 0o600)
	os.WriteFile(filepath.Join(home, ".ssh", "b.conf"), []byte("Host h\n  Port 2345\n"), 0o600)
	cfgFile := filepath.Join(t.TempDir(), "config")
	os.WriteFile(cfgFile, []byte("Include conf.d/*.conf ~/.ssh/b.conf\n"), 0o600)
	p, err := resolve(Config{Destination: "h", ConfigFile: cfgFile})
	if err != nil {
		t.Fatal(err)
	}
	if h := p.hops[0]; h.user != "from-relative" || h.port != 2345 {
		t.Errorf("hop %+v: the included files were not read", h)
	}
}

// TestSystemConfigFaultsStopTheStart: a fault in /etc/ssh/ssh_config other than one the parser cannot read
// (an unknown Match criterion, an included file others may write) stops the start naming the file, as it
// stops ssh, instead of dropping the whole file without a word.
func TestSystemConfigFaultsStopTheStart(t *testing.T) {
	setHome(t, t.TempDir()) // no ~/.ssh/config
	dir := t.TempDir()
	prev := systemConfigFile
	t.Cleanup(func() { systemConfigFile = prev })
	systemConfigFile = filepath.Join(dir, "ssh_config")
	if err := os.WriteFile(systemConfigFile, []byte("Match nosuchcriterion x\n  User u\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := resolve(Config{Destination: "h"}); err == nil || !strings.Contains(err.Error(), systemConfigFile+" line 1") {
		t.Fatalf("err = %v, want one naming %s line 1", err, systemConfigFile)
	}
	if err := os.WriteFile(systemConfigFile, []byte("Host h\n  User fromsystem\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := resolve(Config{Destination: "h"})
	if err != nil {
		t.Fatal(err)
	}
	if p.hops[0].user != "fromsystem" {
		t.Errorf("user %q, want the system file's", p.hops[0].user)
	}
}

// TestMatchExecWaitsForTheShellAlone: a Match exec command that leaves a child in the background holding
// stderr does not hold the start while that child runs; ssh waits for the shell alone too.
func TestMatchExecWaitsForTheShellAlone(t *testing.T) {
	cfgFile := filepath.Join(t.TempDir(), "config")
	if err := os.WriteFile(cfgFile, []byte("Match exec \"sleep 8 & true\"\n  User fromexec\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SHELL", "/bin/sh")
	start := time.Now()
	p, err := resolve(Config{Destination: "h", ConfigFile: cfgFile})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 4*time.Second {
		t.Errorf("resolve took %s: it waited for the background child", took)
	}
	if p.hops[0].user != "fromexec" {
		t.Errorf("user %q, want the Match exec block's", p.hops[0].user)
	}
}

// TestMatchExecStopsWithTheContext: a Match exec command that hangs holds NewContext only until its context
// ends: then the shell and what it started are killed, and NewContext returns the context's error.
func TestMatchExecStopsWithTheContext(t *testing.T) {
	dir := t.TempDir()
	pids := filepath.Join(dir, "pids")
	cfgFile := writeConfig(t, dir, "config", "Match exec \"sleep 60 & echo $$ $! > "+pids+"; wait\"\n  User fromexec\n")
	t.Setenv("SHELL", "/bin/sh")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { // once the command runs
		for ctx.Err() == nil {
			if b, _ := os.ReadFile(pids); strings.HasSuffix(string(b), "\n") {
				cancel()
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	start := time.Now()
	_, err := NewContext(ctx, Config{Destination: "h", ConfigFile: cfgFile})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want the context's", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("NewContext took %s after its context ended", took)
	}
	b, _ := os.ReadFile(pids)
	fields := strings.Fields(string(b))
	if len(fields) != 2 {
		t.Fatalf("the command wrote %q, want its shell's pid and sleep's", b)
	}
	for _, f := range fields {
		pid, _ := strconv.Atoi(f)
		deadline := time.Now().Add(3 * time.Second)
		for running(pid) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if running(pid) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Errorf("process %d of the Match exec command still runs", pid)
		}
	}
}

// running says whether process pid runs: it exists and is no zombie.
func running(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	_, after, _ := strings.Cut(string(b), ") ")
	return !strings.HasPrefix(after, "Z")
}
