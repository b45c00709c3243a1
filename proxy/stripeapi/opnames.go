package stripeapi

import (
	"maps"
	"slices"
	"strings"
	"sync"
)

// The names a policy's operation list can use: every operation the catalogue
// gives a request. A glob that matches none of them allows nothing, which is
// almost always a typo ("charges.creat"), so the admin API refuses it.

// opNames is the set of operation names, built once from the catalogue.
type opNames struct {
	ops       map[string]bool // resource.verb
	resources map[string]bool
	verbs     map[string]bool
	// Sorted, for suggestions: the names, "*.verb" and "resource.*".
	sorted, verbGlobs, resourceGlobs []string
}

var knownOps = sync.OnceValue(func() *opNames {
	n := &opNames{ops: map[string]bool{}, resources: map[string]bool{}, verbs: map[string]bool{}}
	add := func(op string) {
		dot := strings.LastIndexByte(op, '.')
		n.ops[op], n.resources[op[:dot]], n.verbs[op[dot+1:]] = true, true, true
	}
	for _, op := range Operations() {
		add(op)
	}
	for res := range readResources {
		add(res + ".read")
		add(res + ".delete")
	}
	add(OpUnknownRead) // reads outside the catalogue
	n.sorted = slices.Sorted(maps.Keys(n.ops))
	for _, v := range slices.Sorted(maps.Keys(n.verbs)) {
		n.verbGlobs = append(n.verbGlobs, "*."+v)
	}
	for _, r := range slices.Sorted(maps.Keys(n.resources)) {
		n.resourceGlobs = append(n.resourceGlobs, r+".*")
	}
	return n
})

// maxSuggestions is how many close names CheckOperation suggests at most.
const maxSuggestions = 3

// CheckOperation reports whether the well-formed operation glob of a policy
// ("charges.create", "*.read", "checkout.sessions.*", "*") matches an operation
// keybrake knows. When it does not, suggestions are the known names closest to it
// (at most three, none when nothing is close). Stripe's v2 reads are named after
// their path ("v2.core.accounts.read"), so any v2 resource is accepted.
func CheckOperation(glob string) (ok bool, suggestions []string) {
	if glob == "*" {
		return true, nil
	}
	n := knownOps()
	dot := strings.LastIndexByte(glob, '.')
	if dot < 0 {
		return false, n.closest(glob, n.sorted)
	}
	res, verb := glob[:dot], glob[dot+1:]
	v2 := res == "v2" || strings.HasPrefix(res, "v2.")
	switch {
	case res == "*" && verb == "*":
		return true, nil
	case res == "*":
		if n.verbs[verb] {
			return true, nil
		}
		return false, n.closest(glob, n.verbGlobs)
	case verb == "*":
		if n.resources[res] || v2 {
			return true, nil
		}
		return false, n.closest(glob, n.resourceGlobs)
	case n.ops[glob] || (v2 && verb == "read"):
		return true, nil
	}
	return false, n.closest(glob, n.sorted)
}

// closest returns the candidates nearest to s by edit distance: those at the
// smallest distance found (at most maxSuggestions), and none when even that is
// more than a third of s's length (at least two edits).
func (*opNames) closest(s string, candidates []string) []string {
	best := max(2, len(s)/3)
	var out []string
	for _, c := range candidates {
		switch d := editDistance(s, c); {
		case d < best:
			best, out = d, []string{c}
		case d == best && len(out) < maxSuggestions:
			out = append(out, c)
		}
	}
	return out
}

// editDistance is the Levenshtein distance between a and b, in bytes (operation
// names are ASCII).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
