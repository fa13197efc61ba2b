package regionctl

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/edgeguard/edgeguard/pkg/region"
	"github.com/edgeguard/edgeguard/pkg/rules"
)

// problem is one thing wrong with a document or a setting.
type problem struct {
	File    string `json:"file,omitempty"`
	Line    int    `json:"line,omitempty"`
	Rule    string `json:"rule,omitempty"`
	Index   *int   `json:"index,omitempty"`
	Field   string `json:"field,omitempty"`
	Message string `json:"message"`
}

func (p problem) String() string {
	where := ""
	switch {
	case p.File != "" && p.Line > 0:
		where = fmt.Sprintf("%s:%d: ", p.File, p.Line)
	case p.File != "":
		where = p.File + ": "
	}
	switch {
	case p.Field == "" && p.Index == nil:
		return where + p.Message
	case p.Index == nil:
		return where + p.Field + ": " + p.Message
	}
	what := fmt.Sprintf("rules[%d]", *p.Index)
	if p.Rule != "" {
		what = fmt.Sprintf("rule %q", p.Rule)
	}
	if p.Field == "" {
		return where + what + ": " + p.Message
	}
	return where + what + ": " + p.Field + ": " + p.Message
}

// problemsOf lists every problem in a rules or shedder error: the
// *rules.FieldError leaves when there are any, else one per line of text.
func problemsOf(err error) []problem {
	fes := rules.FieldErrors(err)
	var out []problem
	if len(fes) > 0 {
		for _, fe := range fes {
			p := problem{Line: fe.Line, Rule: fe.RuleID, Field: fe.Field, Message: fe.Msg}
			if fe.Index >= 0 {
				i := fe.Index
				p.Index = &i
			}
			out = append(out, p)
		}
		return out
	}
	lines := strings.Split(err.Error(), "\n")
	for i, l := range lines {
		l = strings.TrimSpace(l)
		if l == "" || (i == 0 && len(lines) > 1 && strings.HasSuffix(l, ":")) {
			continue // a header such as "yaml: unmarshal errors:"
		}
		for _, prefix := range []string{"shedder: parse config: ", "invalid shedder config: "} {
			l = strings.TrimPrefix(l, prefix)
		}
		out = append(out, problem{Message: l})
	}
	return out
}

// reportInvalid prints the problems (text: stderr, one per line; json: an
// object on stdout) and returns the error that exits with ExitInvalid.
func (a *app) reportInvalid(what string, probs []problem, tail string) error {
	head := fmt.Sprintf("%s: invalid (%s)%s", what, plural(len(probs), "problem"), tail)
	if a.json() {
		a.emitJSON(map[string]any{"valid": false, "document": what, "problems": probs,
			"error": head, "exit_code": ExitInvalid, "reason": reasonOf(ExitInvalid)})
	}
	fmt.Fprintln(a.stderr, "regionctl: "+head+":")
	for _, p := range probs {
		indent := "  "
		if p.File != "" {
			indent = "" // "FILE:LINE: ..." at the start of the line, as compilers write it
		}
		fmt.Fprintln(a.stderr, indent+p.String())
	}
	return reported(ExitInvalid, head)
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}

// readRulesFile reads and parses a rules file; the error lists every
// problem and exits with ExitInvalid.
func (a *app) readRulesFile(path, tail string) ([]byte, *rules.Document, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("reading rules file: %w", err)
	}
	doc, err := a.parseRules(data)
	if err != nil {
		return nil, nil, a.reportInvalid(path, fileProblems(path, err), tail)
	}
	return data, doc, nil
}

// fileProblems is problemsOf(err), each problem naming file.
func fileProblems(file string, err error) []problem {
	probs := problemsOf(err)
	for i := range probs {
		probs[i].File = file
	}
	return probs
}

// docVersion is rules.DocumentVersion of a stored document ("" when
// absent, "invalid" when it does not parse): what history records for it.
func (a *app) docVersion(data []byte) string {
	if len(bytes.TrimSpace(data)) == 0 {
		return ""
	}
	p := a.parseOnce(data)
	if p.err != nil {
		return "invalid"
	}
	return p.version
}

// parsedDoc is one rules.ParseVersion result.
type parsedDoc struct {
	doc     *rules.Document
	version string
	err     error
}

// parseOnce is rules.ParseVersion, done once per distinct text in a run:
// a push reads, plans and checks the same document several times, and a
// large one takes a while to parse. Parsed documents are not modified
// (Merge and Version work on copies).
func (a *app) parseOnce(data []byte) parsedDoc {
	key := sha256.Sum256(data)
	if p, ok := a.parsed[key]; ok {
		return p
	}
	var p parsedDoc
	p.doc, p.version, p.err = rules.ParseVersion(data)
	if a.parsed == nil {
		a.parsed = map[[sha256.Size]byte]parsedDoc{}
	}
	a.parsed[key] = p
	return p
}

// parseRules is rules.Parse, once per distinct text in a run (parseOnce).
func (a *app) parseRules(data []byte) (*rules.Document, error) {
	p := a.parseOnce(data)
	return p.doc, p.err
}

// versionOf is rules.DocumentVersion of the document data holds, which
// parses (parseOnce).
func (a *app) versionOf(data []byte) string { return a.parseOnce(data).version }

// parseStoredOnce parses a stored document once per run (parseRules);
// nil when absent.
func (a *app) parseStoredOnce(data []byte) (*rules.Document, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, nil
	}
	return a.parseRules(data)
}

// effective is the region's merged rules (rules.Effective's document),
// each document read through parseStoredOnce.
func (a *app) effective(d region.Docs) (*rules.Document, error) {
	g, err := a.parseStoredOnce(d.Global)
	if err != nil {
		return nil, fmt.Errorf("global document: %w", err)
	}
	r, err := a.parseStoredOnce(d.Region)
	if err != nil {
		return nil, fmt.Errorf("region document: %w", err)
	}
	return rules.Merge(g, r)
}

// effectiveVersion is the version of a region's merged rules.
func (a *app) effectiveVersion(d region.Docs) (string, error) {
	eff, err := a.effective(d)
	if err != nil {
		return "", err
	}
	return rules.Version(eff), nil
}

// jsonable turns rules into plain maps and lists, so JSON output uses the
// same field names as the YAML documents. The rules are written by
// rules.Marshal (yaml.v3's encoder takes tens of seconds over 100,000 rules)
// and read back by yaml.v3.
func jsonable(rs []rules.Rule) any {
	data, err := rules.Marshal(&rules.Document{Rules: rs})
	if err != nil {
		return nil
	}
	var out struct {
		Rules any `yaml:"rules"`
	}
	if err := yaml.Unmarshal(data, &out); err != nil {
		return nil
	}
	return out.Rules
}

// shortHash is the version of a shedder document: 12 hex characters of the
// SHA-256 of its canonical JSON, like rules versions.
func shortHash(data []byte) string {
	var v any
	if err := json.Unmarshal(data, &v); err == nil {
		if canon, err := json.Marshal(v); err == nil {
			data = canon
		}
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])[:12]
}

// isInvalid reports whether err means an invalid document (ExitInvalid).
func isInvalid(err error) bool {
	var ce *codedError
	return errors.As(err, &ce) && ce.code == ExitInvalid
}

// entries is plural for "entry" (kind: "" or "history ").
func entries(n int, kind string) string {
	if n == 1 {
		return "1 " + kind + "entry"
	}
	return fmt.Sprintf("%d %sentries", n, kind)
}
