package strictjson

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

type inner struct {
	Prefix string `json:"prefix"`
	Flag   bool   `json:"flag,omitempty"`
}

type embedded struct {
	Promoted int `json:"promoted"`
}

type doc struct {
	embedded
	Mode    string            `json:"mode"`
	Percent *float64          `json:"percent"`
	Inner   inner             `json:"inner"`
	List    []inner           `json:"list"`
	Names   map[string]string `json:"names"`
	When    time.Time         `json:"when"`
	Any     any               `json:"any"`
	Untaged int
	Skipped int `json:"-"`
}

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name, doc, err string
	}{
		{"good", `{"mode":"shadow","percent":5,"inner":{"prefix":"/a"},"list":[{"prefix":"/b","flag":true}],"names":{"a":"b"},"when":"2026-01-02T03:04:05Z","any":{"x":[1]},"Untaged":1,"promoted":2}`, ""},
		{"empty object", `{}`, ""},
		{"unknown key", `{"mode":"shadow","modes":1}`, `unknown field "modes" (did you mean "mode"?)`},
		{"case-only match", `{"MODE":"shadow"}`, `unknown field "MODE": names are case-sensitive, the field is "mode"`},
		{"case-only match of an untagged field", `{"untaged":1}`, `the field is "Untaged"`},
		{"duplicate key", `{"mode":"enforce","mode":"shadow"}`, `field "mode" given twice`},
		{"duplicate key spelled with an escape", `{"mode":"enforce","mod\u0065":"shadow"}`, `field "mode" given twice`},
		{"nested unknown key", `{"list":[{"prefix":"/a"},{"Prefix":"/b"}]}`, `list[1]: unknown field "Prefix"`},
		{"nested duplicate in a map", `{"names":{"a":"1","a":"2"}}`, `names: key "a" given twice`},
		{"duplicate inside any", `{"any":{"x":1,"x":2}}`, `any: key "x" given twice`},
		{"skipped field", `{"Skipped":1}`, `unknown field "Skipped"`},
		{"trailing data", `{"mode":"shadow"} {"mode":"enforce"}`, "data after the JSON value"},
		{"syntax error", `{"mode":`, "reading JSON"},
		{"too deep", `{"any":` + strings.Repeat("[", 200) + strings.Repeat("]", 200) + `}`, "nested deeper than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var d doc
			err := Unmarshal([]byte(tc.doc), &d)
			if tc.err == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.err)
		})
	}
}

func TestUnmarshalDecodes(t *testing.T) {
	var d doc
	require.NoError(t, Unmarshal([]byte(`{"mode":"shadow","percent":5,"promoted":3,"list":[{"prefix":"/b"}]}`), &d))
	require.Equal(t, "shadow", d.Mode)
	require.Equal(t, 5.0, *d.Percent)
	require.Equal(t, 3, d.Promoted)
	require.Equal(t, []inner{{Prefix: "/b"}}, d.List)
}
