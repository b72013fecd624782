//go:build integration

package sshdial

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/konnect-dev/konnect/test/harness"
)

// opensshResolves is what OpenSSH's client resolves for dest from configFile alone ("none" for none), as
// ssh -G prints it: each keyword, in lower case, with its values in order.
func opensshResolves(t *testing.T, configFile, dest string) map[string][]string {
	t.Helper()
	harness.RequireSSH(t, "ssh")
	out, err := exec.Command("ssh", "-F", configFile, "-G", dest).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("ssh -G -F %s %s: %v: %s", configFile, dest, err, stderr)
	}
	got := map[string][]string{}
	for _, line := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok {
			got[k] = append(got[k], v)
		}
	}
	return got
}

// TestMatchAsOpenSSH: for config files with Match blocks, konnect resolves the HostName, User, Port,
// IdentityFile and ProxyJump that ssh -G resolves: Match host after HostName (%h expanded), originalhost,
// user from the destination or from the file, localuser, negation, several criteria on a line, exec with
// tokens, canonical and final, and Match inside an Include.
func TestMatchAsOpenSSH(t *testing.T) {
	dir := t.TempDir()
	setHome(t, dir)
	write := func(name, content string) string { return writeConfig(t, dir, name, content) }
	me := localUser()
	// Each config ends with an IdentityFile for every host, so that ssh -G lists no default key files.
	last := "Host *\n  IdentityFile " + filepath.Join(dir, "last") + "\n"
	write("conf.d/10-first.conf", "Match originalhost inc*\n  IdentityFile /k/d10\nHost incl\n  Port 2410\n")
	write("conf.d/20-second.conf", "Match user admin\n  ProxyJump from-d20\n  Port 2420\n")
	write("never.conf", "User never\nMatch all\n  ProxyJump never\n")
	write("startsactive.conf", "User from-include\nMatch user from-include\n  Port 2430\n")
	write("final.conf", "Match final\n  User never\n")

	for _, tc := range []struct {
		name   string
		config string
		dests  []string
	}{
		{"host after HostName", `Host web db
  HostName %h.corp.example
Match host *.corp.example
  User corp
Match host web
  IdentityFile /k/never-alias
Match host web.corp.example
  Port 2201
  IdentityFile /k/web
Match host DB.CORP.EXAMPLE
  ProxyJump gate
`, []string{"web", "db", "other"}},
		{"Host patterns", `Host we? !wex
  User q
Host *.a?c
  Port 2202
Host x"y"z 'q'r"s"t
  IdentityFile /k/quoted
`, []string{"web", "we", "wex", "x.abc", "x.ac", "xyz", "qrst"}},
		{"originalhost", `Host alias
  HostName real.example
Match originalhost alias
  User orig
Match originalhost real.example
  Port 9
Match originalhost ALIAS,x
  ProxyJump p1
`, []string{"alias", "real.example"}},
		{"user from the destination or the file", `Host box
  User cfguser
Match user admin
  Port 2022
  IdentityFile /k/admin
Match user cfguser
  ProxyJump jumpcfg
Match user ` + me + `
  Port 2023
`, []string{"box", "admin@box", "other", "admin@other"}},
		{"localuser", `Match localuser ` + me + `
  User l1
Match localuser nobody-else,x*
  Port 3
Match localuser !` + me + `,*
  ProxyJump never
`, []string{"h"}},
		{"negation", `Match !host *.internal
  ProxyJump gate
Match host *.corp,!bad.corp
  User corp
Match !user root,admin !originalhost x*
  Port 1022
`, []string{"a.internal", "a.corp", "bad.corp", "admin@a.corp", "xy"}},
		{"several criteria on one line", `Host *.corp
  HostName %h.example
Match host *.corp.example user admin
  Port 2200
Match originalhost a* !localuser nosuch host *.example
  ProxyJump j1
Match originalhost a* localuser nosuch
  User never
`, []string{"a.corp", "admin@a.corp", "b.corp"}},
		{"exec with tokens", `Host alias
  HostName real.example
  User u1
Match exec "test %h = real.example -a %n = alias -a %r = u1 -a %p = 22 -a %u = ` + me + `"
  Port 2244
Match exec "test %n = nope"
  ProxyJump never
Match !exec false
  IdentityFile /k/notfalse
Match exec "exit 3"
  User never
`, []string{"alias", "other"}},
		{"final", `Host alias
  HostName real.example
Host real.example
  User viafinal
Match final host real.example
  Port 2233
Match canonical
  IdentityFile /k/canonical
Match !final
  ProxyJump notfinal
`, []string{"alias", "other"}},
		// ssh takes the host name before the final pass: a HostName read in it changes nothing.
		{"HostName in the final pass", `Match final
  HostName other.example
Host other.example
  User viaother
`, []string{"h", "other.example"}},
		{"canonical without final", `Match canonical
  User canon
Match !canonical
  Port 2200
`, []string{"h"}},
		{"Include with Match inside", `Host inc*
  Include ` + filepath.Join(dir, "conf.d", "*.conf") + `
Host nomatch
  Include ` + filepath.Join(dir, "never.conf") + `
Host incl
  Include ` + filepath.Join(dir, "startsactive.conf") + `
Include ` + filepath.Join(dir, "conf.d", "20-second.conf") + `
`, []string{"incl", "admin@incx", "admin@other", "nomatch", "other"}},
		// ssh matches Host lines against the host as typed in the first pass, and against the HostName,
		// lowercased unless it is an address, in the final pass; Match host and originalhost ignore case.
		{"mixed case without final", `Host myhost
  User lower
Host MyHost
  Port 2201
Match host myhost
  IdentityFile /k/matchhost
Match originalhost MYHOST
  ProxyJump orig
`, []string{"MyHost", "myhost", "MYHOST"}},
		{"mixed case in the final pass", `Host Alias
  HostName Real.Example
Host real.example myhost
  User lowfinal
Host Real.Example MyHost
  Port 2202
Host FE80::A
  User upper6
Match final host real.example,myhost
  IdentityFile /k/final
Match final exec "test %h = real.example -o %h = myhost -o %h = FE80::A"
  ProxyJump exec-lower
`, []string{"Alias", "MyHost", "myhost", "Real.Example", "FE80::A"}},
		// A Match in a file that a block which does not apply includes never applies, but is evaluated
		// all the same: its "final" makes the second pass.
		{"final in an Include that does not apply", `Host nomatch
  Include ` + filepath.Join(dir, "final.conf") + `
Match canonical
  Port 2999
`, []string{"other"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := write("config-"+strings.ReplaceAll(tc.name, " ", "-"), tc.config+last)
			for _, dest := range tc.dests {
				want := opensshResolves(t, f, dest)
				// The destination's own entry, as ssh -G prints it; ssh -G does not read the jump hosts'.
				sc, err := loadSSHConfig(f, logr.Discard())
				if err != nil {
					t.Fatal(err)
				}
				tg, err := resolveEndpoint(dest, "", 0, sc)
				if err != nil {
					t.Fatalf("%s: %v", dest, err)
				}
				_, jump, _, _ := tg.config.first("ProxyJump")
				got := map[string][]string{
					"hostname": {tg.hostName}, "user": {tg.user}, "port": {strconv.Itoa(tg.port)},
					"identityfile": tg.identity, "proxyjump": nil,
				}
				if jump != "" {
					got["proxyjump"] = []string{jump}
				}
				for _, k := range []string{"hostname", "user", "port", "identityfile", "proxyjump"} {
					if !slices.Equal(got[k], want[k]) {
						t.Errorf("%s: %s %q, ssh -G says %q", dest, k, got[k], want[k])
					}
				}
			}
		})
	}
}

// TestMatchExecTokensAsOpenSSH: Match exec runs with $SHELL -c and expands every token konnect documents
// as ssh does: each writes what it ran to a file, and the two files are the same.
func TestMatchExecTokensAsOpenSSH(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	shellLog := filepath.Join(dir, "shell.log")
	shell := filepath.Join(dir, "shell")
	os.WriteFile(shell, []byte("#!/bin/sh\necho \"$1\" >> "+shellLog+"\nexec /bin/sh \"$@\"\n"), 0o700)
	t.Setenv("SHELL", shell)
	cfgFile := filepath.Join(dir, "config")
	os.WriteFile(cfgFile, []byte(`Host alias
  HostName real.example
  HostKeyAlias keyalias
  User u1
  Port 2222
Match exec "echo %C %L %l %d %h %i %k %n %p %r %u %% > `+out+`"
  User matched
`), 0o600)
	opensshResolves(t, cfgFile, "alias")
	want, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(out)
	if _, err := resolve(Config{Destination: "alias", ConfigFile: cfgFile}); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(out); err != nil || string(got) != string(want) {
		t.Errorf("Match exec ran %q (%v), ssh ran %q", got, err, want)
	}
	if b, _ := os.ReadFile(shellLog); string(b) != "-c\n-c\n" {
		t.Errorf("$SHELL ran with %q, want -c for ssh and for konnect", b)
	}
}

// TestConfigOwnerAsOpenSSH: ~/.ssh/config and every included file, whose ProxyCommand and Match exec lines
// run as the user, are refused when another user could have written them, naming the file, where ssh stops
// with "Bad owner or permissions": another user owns it, others may write it, or a group with another
// member may. A group of the owner alone may write it (Debian's ssh agrees: its users' umask is 002). A
// file named by -F is read whatever its mode, as by ssh.
func TestConfigOwnerAsOpenSSH(t *testing.T) {
	harness.RequireSSH(t, "ssh")
	if os.Getuid() != 0 {
		t.Skip("gives files to other users and groups: needs root, as in CI")
	}
	// nogroup is nobody's primary group, so it has a member other than root.
	const shared = 65534
	if privateGroup(shared, 0) {
		t.Fatalf("group %d has root alone as its member here", shared)
	}
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode, uid, gid int) string {
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(f, uid, gid); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(f, mode); err != nil { // past the umask
			t.Fatal(err)
		}
		return f
	}
	inc := func(name string, mode os.FileMode, uid, gid int) (config, included string) {
		included = write(name+".conf", "Host h\n  User from"+name+"\n", mode, uid, gid)
		return write("config-"+name, "Include "+included+"\nHost *\n  IdentityFile /k/last\n", 0o600, 0, 0), included
	}
	for _, tc := range []struct {
		name     string
		mode     os.FileMode
		uid, gid int
		refused  bool
	}{
		{"mode 0644", 0o644, 0, 0, false},
		{"writable by the owner's own group", 0o664, 0, 0, false},
		{"writable by a group with another member", 0o620, 0, shared, true},
		{"writable by others", 0o602, 0, 0, true},
		{"owned by another user", 0o644, shared, 0, true},
	} {
		t.Run("included file "+tc.name, func(t *testing.T) {
			// A quote in the name would make the Include line one that ssh refuses ("invalid quotes").
			config, included := inc(strings.NewReplacer(" ", "-", "'", "").Replace(tc.name), tc.mode, tc.uid, tc.gid)
			out, sshErr := exec.Command("ssh", "-F", config, "-G", "h").CombinedOutput()
			if !tc.refused && sshErr != nil {
				t.Fatalf("ssh -G: %v: %s, want it read", sshErr, out)
			}
			if sshRefused := sshErr != nil && strings.Contains(string(out), "Bad owner or permissions"); sshRefused != tc.refused {
				t.Fatalf("ssh -G: %v: %s, want refused %v", sshErr, out, tc.refused)
			}
			_, err := resolve(Config{Destination: "h", ConfigFile: config})
			if !tc.refused && err != nil {
				t.Fatalf("konnect: %v, want it read", err)
			}
			if tc.refused && (err == nil || !strings.Contains(err.Error(), included)) {
				t.Fatalf("konnect: %v, want a refusal naming %s", err, included)
			}
		})
	}

	t.Run("-F file everyone may write", func(t *testing.T) {
		config := write("open-F", "Host h\n  User fromF\n", 0o666, shared, shared)
		if out, err := exec.Command("ssh", "-F", config, "-G", "h").CombinedOutput(); err != nil {
			t.Fatalf("ssh -G: %v: %s", err, out)
		}
		if _, err := resolve(Config{Destination: "h", ConfigFile: config}); err != nil {
			t.Fatalf("konnect: %v, want it read, as ssh reads it", err)
		}
	})

	t.Run("~/.ssh/config", func(t *testing.T) {
		home := t.TempDir()
		setHome(t, home)
		f := filepath.Join(home, ".ssh", "config")
		if err := os.MkdirAll(filepath.Dir(f), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte("Host h\n  ProxyCommand nc %h %p\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := resolve(Config{Destination: "h"}); err != nil {
			t.Fatalf("mode 0600: %v", err)
		}
		if err := os.Chown(f, 0, shared); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(f, 0o660); err != nil {
			t.Fatal(err)
		}
		if _, err := resolve(Config{Destination: "h"}); err == nil || !strings.Contains(err.Error(), f) || !strings.Contains(err.Error(), "chmod go-w") {
			t.Fatalf("mode 0660, group %d: %v, want a refusal naming %s and the fix", shared, err, f)
		}
	})
}

// TestJumpHostLoop: a route that reaches a server twice is refused naming it, before any connection: a
// jump host whose own ProxyJump names itself (ssh -G stops at it with "jumphost loop"), the common
// "Host * / ProxyJump gate" that gate matches too (with which ssh's connection to any host fails the same
// way, one ssh further in), and a cycle of two jump hosts, with which ssh would start ssh after ssh.
func TestJumpHostLoop(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string { return writeConfig(t, dir, name, content) }
	everyHost := write("every-host", "Host *\n  ProxyJump gate\n")
	harness.RequireSSH(t, "ssh")
	if out, err := exec.Command("ssh", "-F", everyHost, "-G", "gate").CombinedOutput(); err == nil || !strings.Contains(string(out), "jumphost loop via gate") {
		t.Fatalf("ssh -G gate: %v: %s, want a jumphost loop", err, out)
	}
	cycle := write("cycle", "Host target\n  ProxyJump a\nHost a\n  ProxyJump b\nHost b\n  ProxyJump a\n")
	for _, tc := range []struct{ config, dest, loop string }{
		{everyHost, "gate", "gate -> gate"},
		{everyHost, "x.corp", "gate -> gate -> x.corp"},
		{cycle, "target", "a -> b -> a -> target"},
	} {
		_, err := resolve(Config{Destination: tc.dest, ConfigFile: tc.config})
		if err == nil || !strings.Contains(err.Error(), "jump host loop via") || !strings.Contains(err.Error(), tc.loop) {
			t.Errorf("%s: %v, want a jump host loop through %s", tc.dest, err, tc.loop)
		}
	}
}

// TestProxyUseFdpassAsOpenSSH: konnect reads ProxyUseFdpass as ssh -G does: yes or true in any case, the
// first value for the host, from Host and Match blocks; and both refuse a value that is not a flag.
func TestProxyUseFdpassAsOpenSSH(t *testing.T) {
	dir := t.TempDir()
	setHome(t, dir)
	f := writeConfig(t, dir, "config", `Host true
  ProxyUseFdpass true
Host upper first
  ProxyUseFdpass YES
Host first
  ProxyUseFdpass no
Host false
  ProxyUseFdpass false
Match originalhost matched
  ProxyUseFdpass yes
Host *
  ProxyCommand nc %h %p
  IdentityFile `+filepath.Join(dir, "last")+`
`)
	sc, err := loadSSHConfig(f, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	for _, dest := range []string{"true", "upper", "first", "false", "matched", "unset"} {
		want := opensshResolves(t, f, dest)["proxyusefdpass"]
		tg, err := resolveEndpoint(dest, "", 0, sc)
		if err != nil {
			t.Fatalf("%s: %v", dest, err)
		}
		on, err := proxyUseFdpass(&tg)
		if err != nil {
			t.Fatalf("%s: %v", dest, err)
		}
		got := map[bool]string{true: "yes", false: "no"}[on]
		if len(want) != 1 || got != want[0] {
			t.Errorf("%s: ProxyUseFdpass %s, ssh -G says %q", dest, got, want)
		}
		// And the dialer takes it, for the hop the ProxyCommand reaches.
		p, err := resolve(Config{Destination: dest, ConfigFile: f})
		if err != nil {
			t.Fatalf("%s: %v", dest, err)
		}
		if h := p.hops[0]; h.proxyCommand == "" || h.proxyUseFdpass != on {
			t.Errorf("%s: the hop has ProxyCommand %q, proxyUseFdpass %v; want nc's, %v", dest, h.proxyCommand, h.proxyUseFdpass, on)
		}
	}

	bad := writeConfig(t, dir, "bad", "Host *\n  ProxyCommand nc %h %p\n  ProxyUseFdpass maybe\n")
	if out, err := exec.Command("ssh", "-F", bad, "-G", "h").CombinedOutput(); err == nil {
		t.Fatalf("ssh -G took ProxyUseFdpass maybe: %s", out)
	}
	if _, err := resolve(Config{Destination: "h", ConfigFile: bad}); err == nil || !strings.Contains(err.Error(), `ProxyUseFdpass "maybe"`) {
		t.Errorf("resolve = %v, want an error naming ProxyUseFdpass \"maybe\"", err)
	}
}
