package manifests

import (
	"bytes"
	"fmt"
)

// Document is one document of a YAML stream, as SplitDocuments cut it.
type Document struct {
	Separator []byte // the "---" line before Body, with its line end; empty for the first document
	Body      []byte
}

// SplitDocuments cuts a YAML stream at its "---" lines and keeps every byte: the Separators and Bodies, in
// order, are data. Documents may be empty ("---" twice, or at the end); readers that want objects skip
// them. A "---" line may end in spaces and a comment, as for kubectl's reader (apimachinery's YAMLReader);
// one followed by anything else would hide a second document inside the first, and is an error.
func SplitDocuments(data []byte) ([]Document, error) {
	var docs []Document
	var sep []byte
	start := 0 // where the current document's body starts
	for pos := 0; pos < len(data); {
		end := len(data)
		if i := bytes.IndexByte(data[pos:], '\n'); i >= 0 {
			end = pos + i + 1
		}
		line := data[pos:end]
		if rest, ok := bytes.CutPrefix(line, []byte("---")); ok {
			rest = bytes.TrimSpace(rest)
			if len(rest) > 0 && rest[0] != '#' {
				return nil, fmt.Errorf(`document %d: holds more than one YAML document; separate documents with a line holding only "---"`, len(docs)+1)
			}
			if pos > 0 || sep != nil {
				docs = append(docs, Document{Separator: sep, Body: data[start:pos]})
			}
			sep, start = line, end
		}
		pos = end
	}
	return append(docs, Document{Separator: sep, Body: data[start:]}), nil
}
