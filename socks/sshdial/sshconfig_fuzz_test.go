package sshdial

import (
	"slices"
	"strings"
	"testing"
)

// quoteWord quotes w so that OpenSSH's argv_split reads it back as one word, w: in double quotes, with
// backslash, double and single quote escaped.
func quoteWord(w string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, `'`, `\'`).Replace(w) + `"`
}

// FuzzConfigLine: any ssh_config line is split into keyword and words, and a Match line's words into
// criteria, without a panic; the words are those OpenSSH's argv_split reads, so they keep no quote or escape
// it would have removed: quoted one by one and joined again, they read back the same. A Match line's
// criteria, written back as words, read back the same too.
func FuzzConfigLine(f *testing.F) {
	for _, seed := range []string{
		"Host a b",
		"  Host=web db # comment",
		`Host "with space" 'single' x"y"z`,
		`Host a\ b c\"d \\e`,
		"Host *.corp !bad.corp\r",
		"Include ~/.ssh/conf.d/*.conf /etc/ssh/ssh_config.d/*.conf",
		`Include "/path with/space.conf"`,
		"Match all",
		"Match=host *.corp,!bad.corp User admin",
		`  match !originalhost b* exec "test -e /x # y" # comment`,
		`Match exec 'test -e "/a b"'`,
		`Match exec "sh -c \"echo \\\"hi\\\"\""`,
		"Match canonical final localuser root",
		"Match localnetwork 10.0.0.0/8 tagged x",
		`Match exec "true`,
		"Match host",
		"Match # nothing",
		"\tUser = admin",
		"ProxyCommand ssh -W %h:%p gate",
		"#Host commented",
		"",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, line string) {
		keyword, rest := configKeyword(line)
		if strings.ContainsAny(keyword, " \t=") {
			t.Fatalf("keyword %q of %q holds a separator", keyword, line)
		}
		words, err := configWords(rest)
		if err != nil {
			return
		}
		quoted := make([]string, len(words))
		for i, w := range words {
			quoted[i] = quoteWord(w)
		}
		again, err := configWords(strings.Join(quoted, " "))
		if err != nil || !slices.Equal(again, words) {
			t.Fatalf("%q: words %q, quoted %q, read back as %q (%v)", line, words, quoted, again, err)
		}
		if !strings.EqualFold(keyword, "match") {
			return
		}
		criteria, err := parseMatch(words)
		if err != nil {
			return
		}
		var back []string
		for _, c := range criteria {
			name := c.name
			if c.negate {
				name = "!" + name
			}
			back = append(back, name)
			if c.name != "all" && c.name != "canonical" && c.name != "final" {
				back = append(back, c.arg)
			}
		}
		if again, err := parseMatch(back); err != nil || !slices.Equal(again, criteria) {
			t.Fatalf("%q: criteria %+v, written back as %q, read back as %+v (%v)", line, criteria, back, again, err)
		}
	})
}
