package awsfront

import "testing"

// TestMotoView: werkzeug 3.1's request.url for these paths and queries,
// as Python printed them (werkzeug.test.EnvironBuilder, Request.url),
// with botocore's sorting of the query's raw pairs.
func TestMotoView(t *testing.T) {
	for _, c := range []struct{ path, query, wantPath, wantQuery string }{
		{"/b/a%2Bb", "prefix=p%2F&x=a%2Bb&d=%2F", "/b/a+b", "d=/&prefix=p/&x=a%2Bb"},
		{"/b/%C3%BC", "", "/b/ü", ""},
		{"/b/a%20b", "p=a%20b", "/b/a%20b", "p=a%20b"},
		{"/b/a%3Db", "uploads", "/b/a=b", "uploads="},
		{"/b/a%3Fb%23c", "", "/b/a%3Fb%23c", ""},
		{"/b/x%3By", "", "/b/x", ""},
	} {
		got := motoView(c.path, c.query, "s3")
		if got.uri != c.wantPath || got.query != c.wantQuery {
			t.Errorf("%s?%s: moto reads %s?%s, want %s?%s", c.path, c.query, got.uri, got.query, c.wantPath, c.wantQuery)
		}
	}
}
