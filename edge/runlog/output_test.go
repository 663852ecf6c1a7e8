package runlog

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestChunkerSplitsOnCharacterBoundaries(t *testing.T) {
	euro := "€" // 3 bytes
	tests := []struct {
		name   string
		max    int
		writes []string
		want   []string
	}{
		{"short text passes whole", 8, []string{"hello"}, []string{"hello"}},
		{"long text is cut at max", 4, []string{"abcdefghij"}, []string{"abcd", "efgh", "ij"}},
		{"a character is never cut", 4, []string{"ab" + euro + "c"}, []string{"ab", euro + "c"}},
		{"a character cut by a read waits for its end", 8, []string{"a" + euro[:1], euro[1:] + "b"}, []string{"a", euro + "b"}},
		{"invalid bytes become replacement characters", 8, []string{"a\xffb"}, []string{"a\uFFFDb"}},
		{"an unfinished character at the end is flushed as a replacement", 8, []string{"a" + euro[:2]}, []string{"a", "\uFFFD"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewChunker(tt.max)
			var got []string
			for _, w := range tt.writes {
				got = append(got, c.Write([]byte(w))...)
			}
			got = append(got, c.Flush()...)
			if strings.Join(got, "|") != strings.Join(tt.want, "|") {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func FuzzChunker(f *testing.F) {
	f.Add([]byte("héllo wörld €€€ 𝄞"), uint8(3), uint8(5))
	f.Add([]byte("\xff\xfe\xe2\x82"), uint8(1), uint8(4))
	f.Fuzz(func(t *testing.T, data []byte, step, size uint8) {
		c := NewChunker(int(size))
		limit := max(int(size), utf8.UTFMax)
		n := int(step%16) + 1
		var texts []string
		for i := 0; i < len(data); i += n {
			texts = append(texts, c.Write(data[i:min(i+n, len(data))])...)
		}
		texts = append(texts, c.Flush()...)
		for _, s := range texts {
			if len(s) > limit || len(s) == 0 || !utf8.ValidString(s) {
				t.Fatalf("text %q: %d bytes (max %d), valid %v", s, len(s), limit, utf8.ValidString(s))
			}
		}
		if utf8.Valid(data) && strings.Join(texts, "") != string(data) {
			t.Fatalf("valid input %q came out as %q", data, texts)
		}
	})
}
