package sshdial

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// The settings that follow an accepted key come from the SSH config file, with OpenSSH's defaults, and a
// value OpenSSH would refuse is an error naming the setting.
func TestAuthSettings(t *testing.T) {
	read := func(t *testing.T, conf string) (authSettings, error) {
		file := filepath.Join(t.TempDir(), "config")
		if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		p, err := resolve(Config{Destination: "bastion", ConfigFile: file})
		if err != nil {
			return authSettings{}, err
		}
		return p.hops[0].auth, nil
	}
	for _, tc := range []struct {
		name, conf string
		want       authSettings
		err        string
	}{
		{"defaults", "", authSettings{preferred: opensshPreferred, kbdInteractive: true, password: true, passwordPrompts: 3}, ""},
		{"set", "Host bastion\n  PreferredAuthentications publickey,password\n  KbdInteractiveAuthentication no\n  NumberOfPasswordPrompts 1\n",
			authSettings{preferred: []string{"publickey", "password"}, password: true, passwordPrompts: 1}, ""},
		{"old name", "Host *\n  ChallengeResponseAuthentication no\n  PasswordAuthentication no\n",
			authSettings{preferred: opensshPreferred, passwordPrompts: 3}, ""},
		{"not yes or no", "Host *\n  PasswordAuthentication maybe\n", authSettings{}, "config line 2: PasswordAuthentication for bastion"},
		{"no prompts", "Host *\n  NumberOfPasswordPrompts 0\n",
			authSettings{preferred: opensshPreferred, kbdInteractive: true, password: true, passwordPrompts: 0}, ""},
		{"BatchMode", "Host *\n  BatchMode yes\n  NumberOfPasswordPrompts 2\n",
			authSettings{preferred: opensshPreferred, kbdInteractive: true, password: true, passwordPrompts: 0}, ""},
		{"BatchMode not yes or no", "Host *\n  BatchMode sometimes\n", authSettings{}, "config line 2: BatchMode for bastion"},
		{"negative prompts", "Host *\n  NumberOfPasswordPrompts -1\n", authSettings{}, "config line 2: NumberOfPasswordPrompts for bastion"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := read(t, tc.conf)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one naming %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}
