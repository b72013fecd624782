package manifests

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// ServiceRef names the Service through which kube-apiserver reaches an extension server.
type ServiceRef struct {
	Name, Namespace string
}

func (r ServiceRef) String() string { return r.Namespace + "/" + r.Name }

// Patched names one caBundle that SetCABundle set: KIND NAME, and for a webhook configuration
// CONFIGURATION/WEBHOOK.
type Patched struct {
	Kind, Name string
}

func (p Patched) String() string { return p.Kind + " " + p.Name }

// SetCABundle sets caBundle to bundle wherever an object in the YAML stream data reaches its server through
// the Service ref:
//
//   - every webhook of a ValidatingWebhookConfiguration or MutatingWebhookConfiguration whose
//     clientConfig.service is ref;
//   - spec.conversion.webhook.clientConfig of a CustomResourceDefinition whose service is ref;
//   - spec.caBundle of an APIService whose spec.service is ref.
//
// An object may also be an item of a List, or of a list of its kind such as a
// ValidatingWebhookConfigurationList.
//
// An existing caBundle is replaced. Webhooks that point elsewhere or by URL are left alone, and so is every
// document without a match, byte for byte; a document with a match keeps its keys, their order and its
// comments, and is re-indented with two spaces; it keeps "\r\n" line ends when it had them, and one that was
// JSON is written as JSON. A document that holds a second one behind a marker that is not a "---" line of
// its own is an error, not cut short.
func SetCABundle(data []byte, ref ServiceRef, bundle []byte) ([]byte, []Patched, error) {
	value := base64.StdEncoding.EncodeToString(bundle)
	var out bytes.Buffer
	var patched []Patched
	docs, err := SplitDocuments(data)
	if err != nil {
		return nil, nil, err
	}
	for i, doc := range docs {
		root, err := decodeDocument(doc.Body)
		if err != nil {
			return nil, nil, fmt.Errorf("document %d: %w", i+1, err)
		}
		var found []Patched
		if len(root.Content) == 1 {
			found = setCABundle(root.Content[0], ref, value)
		}
		out.Write(doc.Separator)
		if len(found) == 0 {
			out.Write(doc.Body)
			continue
		}
		patched = append(patched, found...)
		var b []byte
		if json.Valid(doc.Body) {
			b, err = encodeJSON(root)
		} else {
			b, err = encodeYAML(root)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("document %d: %w", i+1, err)
		}
		if bytes.Contains(doc.Body, []byte("\r\n")) {
			// The encoders end lines with "\n" alone; a line break inside a scalar they write is read back as
			// "\n" either way.
			b = bytes.ReplaceAll(b, []byte("\n"), []byte("\r\n"))
		}
		out.Write(b)
	}
	return out.Bytes(), patched, nil
}

func encodeYAML(root *yaml.Node) ([]byte, error) {
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(root); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// encodeJSON writes a document that was JSON as JSON again, indented with two spaces. The YAML encoder would
// write it in YAML's flow style, which is not JSON: the key it adds is not quoted, and it has escapes, such
// as \x01, that JSON lacks; "kubectl apply" reads a file that starts with "{" as JSON and fails on them.
func encodeJSON(root *yaml.Node) ([]byte, error) {
	var compact bytes.Buffer
	if err := writeJSON(&compact, root); err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if err := json.Indent(&b, compact.Bytes(), "", "  "); err != nil {
		return nil, err
	}
	b.WriteByte('\n')
	return b.Bytes(), nil
}

// writeJSON writes n as compact JSON, keys in their order. A scalar that is quoted, or a string by its tag, is
// a JSON string; any other is a number, true, false or null of the JSON it was read from, and is written as
// it was.
func writeJSON(b *bytes.Buffer, n *yaml.Node) error {
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) != 1 {
			return errors.New("not one JSON value")
		}
		return writeJSON(b, n.Content[0])
	case yaml.MappingNode:
		b.WriteByte('{')
		for i := 0; i+1 < len(n.Content); i += 2 {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := writeJSONString(b, n.Content[i].Value); err != nil {
				return err
			}
			b.WriteByte(':')
			if err := writeJSON(b, n.Content[i+1]); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	case yaml.SequenceNode:
		b.WriteByte('[')
		for i, c := range n.Content {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := writeJSON(b, c); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case yaml.ScalarNode:
		if n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) != 0 || n.Tag == "!!str" || !json.Valid([]byte(n.Value)) {
			return writeJSONString(b, n.Value)
		}
		b.WriteString(n.Value)
	default:
		return fmt.Errorf("YAML node kind %v has no JSON form", n.Kind)
	}
	return nil
}

func writeJSONString(b *bytes.Buffer, s string) error {
	enc := json.NewEncoder(b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		return err
	}
	b.Truncate(b.Len() - 1) // Encode's newline
	return nil
}

// decodeDocument parses body, which must hold at most one YAML document. yaml.Unmarshal reads the first
// and ignores the rest, and the rest would be missing from what SetCABundle writes back.
func decodeDocument(body []byte) (*yaml.Node, error) {
	if json.Valid(body) {
		body = yamlSafeJSON(body)
	}
	dec := yaml.NewDecoder(bytes.NewReader(body))
	var root yaml.Node
	if err := dec.Decode(&root); err != nil && err != io.EOF { // io.EOF: empty, or only comments
		return nil, err
	}
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case err == io.EOF:
		return &root, nil
	case err != nil:
		return nil, err
	default:
		return nil, errors.New(`holds more than one YAML document; separate documents with a line holding only "---"`)
	}
}

// yamlSafeJSON rewrites the strings of a JSON document that use escapes JSON has and YAML lacks: "\/", and
// the surrogate pairs ("\ud83d\ude00") that encoders such as Python's write for characters outside the
// Basic Multilingual Plane. Each such string is written again as encoding/json writes it, with the same
// meaning; everything else stays byte for byte.
func yamlSafeJSON(body []byte) []byte {
	var out bytes.Buffer
	for i := 0; i < len(body); {
		if body[i] != '"' {
			out.WriteByte(body[i])
			i++
			continue
		}
		end, escaped := i+1, false
		for end < len(body) && body[end] != '"' {
			if body[end] == '\\' {
				escaped = true
				end++
			}
			end++
		}
		lit := body[i:min(end+1, len(body))]
		if escaped {
			var str string
			if json.Unmarshal(lit, &str) == nil {
				var b bytes.Buffer
				enc := json.NewEncoder(&b)
				enc.SetEscapeHTML(false)
				if enc.Encode(str) == nil {
					lit = bytes.TrimSuffix(b.Bytes(), []byte("\n"))
				}
			}
		}
		out.Write(lit)
		i = end + 1
	}
	return out.Bytes()
}

// setCABundle patches one object, or each item of a list, and says what it patched.
func setCABundle(obj *yaml.Node, ref ServiceRef, value string) []Patched {
	return setCABundleOf(obj, scalar(lookup(obj, "kind")), ref, value)
}

// setCABundleOf is setCABundle for obj of kind.
func setCABundleOf(obj *yaml.Node, kind string, ref ServiceRef, value string) []Patched {
	name := scalar(lookup(obj, "metadata", "name"))
	var found []Patched
	switch {
	case strings.HasSuffix(kind, "List"):
		// "kubectl get -o yaml" writes a List of the objects it got; the API server's own lists, such as a
		// ValidatingWebhookConfigurationList, leave out the kind of their items.
		items := lookup(obj, "items")
		if items == nil || items.Kind != yaml.SequenceNode {
			return nil
		}
		for _, item := range items.Content {
			itemKind := scalar(lookup(item, "kind"))
			if itemKind == "" && kind != "List" {
				itemKind = strings.TrimSuffix(kind, "List")
			}
			found = append(found, setCABundleOf(item, itemKind, ref, value)...)
		}
	case kind == "ValidatingWebhookConfiguration" || kind == "MutatingWebhookConfiguration":
		webhooks := lookup(obj, "webhooks")
		if webhooks == nil || webhooks.Kind != yaml.SequenceNode {
			return nil
		}
		for _, w := range webhooks.Content {
			cc := lookup(w, "clientConfig")
			if cc != nil && servesRef(lookup(cc, "service"), ref) {
				setScalar(cc, "caBundle", value)
				found = append(found, Patched{Kind: kind, Name: name + "/" + scalar(lookup(w, "name"))})
			}
		}
	case kind == "CustomResourceDefinition":
		cc := lookup(obj, "spec", "conversion", "webhook", "clientConfig")
		if cc != nil && servesRef(lookup(cc, "service"), ref) {
			setScalar(cc, "caBundle", value)
			found = append(found, Patched{Kind: kind, Name: name})
		}
	case kind == "APIService":
		spec := lookup(obj, "spec")
		if spec != nil && servesRef(lookup(spec, "service"), ref) {
			setScalar(spec, "caBundle", value)
			found = append(found, Patched{Kind: kind, Name: name})
		}
	}
	return found
}

func servesRef(svc *yaml.Node, ref ServiceRef) bool {
	return svc != nil && scalar(lookup(svc, "name")) == ref.Name && scalar(lookup(svc, "namespace")) == ref.Namespace
}

// lookup follows keys through nested mappings; nil when one is missing.
func lookup(n *yaml.Node, keys ...string) *yaml.Node {
	for _, k := range keys {
		if n == nil || n.Kind != yaml.MappingNode {
			return nil
		}
		var next *yaml.Node
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == k {
				next = n.Content[i+1]
				break
			}
		}
		n = next
	}
	return n
}

func scalar(n *yaml.Node) string {
	if n == nil || n.Kind != yaml.ScalarNode {
		return ""
	}
	return strings.TrimSpace(n.Value)
}

// setScalar sets key to a plain string in mapping m, adding the key when it is missing. The value it replaces
// leaves its comments to the new one; one between the key and the value moves above the key, where the
// encoder keeps it in place.
func setScalar(m *yaml.Node, key, value string) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if k, v := m.Content[i], m.Content[i+1]; k.Value == key {
			switch {
			case k.HeadComment == "":
				k.HeadComment = v.HeadComment
			case v.HeadComment != "":
				k.HeadComment += "\n" + v.HeadComment
			}
			*v = yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: value, LineComment: v.LineComment, FootComment: v.FootComment}
			return
		}
	}
	m.Content = append(m.Content,
		&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key},
		&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: value})
}
