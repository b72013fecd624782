package manifests

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"testing"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

func splitForTest(t *testing.T, data []byte) []Document {
	t.Helper()
	docs, err := SplitDocuments(data)
	if err != nil {
		t.Fatal(err)
	}
	return docs
}

// yamlReaderDocuments is how kubectl reads a stream: apimachinery's YAMLReader, until EOF or its error.
func yamlReaderDocuments(data []byte) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return docs, err
		}
		docs = append(docs, doc)
	}
}

// content is what a document holds for a YAML parser: its lines with "\n" ends, without the "---" lines that
// apimachinery's YAMLReader leaves at the start of the stream's first document.
func content(doc []byte) []byte {
	doc = bytes.ReplaceAll(doc, []byte("\r\n"), []byte("\n"))
	if len(doc) > 0 && doc[len(doc)-1] != '\n' {
		doc = append(doc, '\n')
	}
	for {
		rest, ok := bytes.CutPrefix(doc, []byte("---"))
		if !ok {
			return doc
		}
		line, after, _ := bytes.Cut(rest, []byte("\n"))
		if t := bytes.TrimSpace(line); len(t) > 0 && t[0] != '#' {
			return doc
		}
		doc = after
	}
}

// SplitDocuments cuts where kubectl's reader (apimachinery's YAMLReader) cuts, refuses what it refuses, and
// keeps every byte. YAMLReader differs in form only: it rewrites "\r\n" as "\n", ends the last line with
// "\n", keeps a leading "---" line in the first document and returns "---" alone as a document for a
// stream that starts with two of them; content() undoes that, and empty documents are skipped.
func TestSplitDocumentsAgreesWithYAMLReader(t *testing.T) {
	inputs := []string{
		"", "\n", "---\n", "---", "a: 1\n", "a: 1", "---\na: 1\n", "a: 1\n---\nb: 2\n", "a: 1\n---\nb: 2",
		"a: 1\n--- # c\nb: 2\n", "a: 1\n---#c\nb: 2\n", "a: 1\n---\t\nb: 2\n", "a: 1\n---   \nb: 2\n",
		"a: 1\n---x\nb: 2\n", "a: 1\n----\n", "--- {a: 1}\n", "a: 1\n--- {b: 2}\n",
		"a: 1\r\n---\r\nb: 2\r\n", "a: 1\r\n--- # c\r\nb: 2\r\n",
		"a: 1\n---\n---\nb: 2\n", "---\n---\n", "a: 1\n---\n", "a: 1\n...\n", "a: 1\n...\n---\nb: 2\n",
		"a: |\n  ---\n  text\n", " ---\nb: 2\n", "# only a comment\n---\n# another\n",
		webhookStream, listStream,
	}
	for _, in := range inputs {
		read, wantErr := yamlReaderDocuments([]byte(in))
		var want [][]byte
		for _, d := range read {
			if c := content(d); len(c) > 0 {
				want = append(want, c)
			}
		}
		docs, err := SplitDocuments([]byte(in))
		if (err != nil) != (wantErr != nil) {
			t.Errorf("%q: SplitDocuments error %v, YAMLReader error %v", in, err, wantErr)
			continue
		}
		if err != nil {
			continue
		}
		var joined []byte
		var got [][]byte
		for _, d := range docs {
			joined = append(append(joined, d.Separator...), d.Body...)
			if c := content(d.Body); len(c) > 0 {
				got = append(got, c)
			}
		}
		if string(joined) != in {
			t.Errorf("%q: the documents join to %q", in, joined)
		}
		if len(got) != len(want) {
			t.Errorf("%q: %d documents %q, YAMLReader %d %q", in, len(got), got, len(want), want)
			continue
		}
		for i := range got {
			if !bytes.Equal(got[i], want[i]) {
				t.Errorf("%q: document %d is %q, YAMLReader's %q", in, i+1, got[i], want[i])
			}
		}
	}
}
