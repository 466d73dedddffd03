//! A line diff for people: what changed in a hook's file since it was approved (the review of
//! `/v1/hooks/{name}/review`, issue 50). Longest common subsequence over lines, shown as
//! unified-diff hunks with three lines of context. Bounded: files past [`MAX_CELLS`] line pairs
//! are not diffed (the review then says so).

/// Most `old lines × new lines` diffed.
pub const MAX_CELLS: usize = 4_000_000;
const CONTEXT: usize = 3;

/// The unified diff of `old` and `new` (`-`, `+` and ` ` lines, hunks headed by `@@ -a,b +c,d @@`),
/// or `None` when they are too large to compare.
pub fn unified(old: &str, new: &str) -> Option<String> {
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    if a.len().saturating_mul(b.len()) > MAX_CELLS {
        return None;
    }
    // lcs[i][j]: length of the longest common subsequence of a[i..] and b[j..].
    let w = b.len() + 1;
    let mut lcs = vec![0u32; (a.len() + 1) * w];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i * w + j] = if a[i] == b[j] {
                lcs[(i + 1) * w + j + 1] + 1
            } else {
                lcs[(i + 1) * w + j].max(lcs[i * w + j + 1])
            };
        }
    }
    // The edit script: (tag, old index, new index).
    let mut ops: Vec<(char, usize, usize)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            ops.push((' ', i, j));
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || lcs[(i + 1) * w + j] >= lcs[i * w + j + 1]) {
            // Removals before additions, as `diff -u` shows a changed line.
            ops.push(('-', i, j));
            i += 1;
        } else {
            ops.push(('+', i, j));
            j += 1;
        }
    }
    let mut out = String::new();
    let mut k = 0;
    while k < ops.len() {
        if ops[k].0 == ' ' {
            k += 1;
            continue;
        }
        // A hunk: from CONTEXT lines before this change to CONTEXT lines after the last change
        // that is at most 2 * CONTEXT unchanged lines from the next.
        let start = k.saturating_sub(CONTEXT);
        let mut end = k;
        let mut quiet = 0;
        while end < ops.len() && quiet <= 2 * CONTEXT {
            if ops[end].0 == ' ' {
                quiet += 1;
            } else {
                quiet = 0;
            }
            end += 1;
        }
        let end = (end - quiet + CONTEXT.min(quiet)).min(ops.len());
        let hunk = &ops[start..end];
        let old_n = hunk.iter().filter(|o| o.0 != '+').count();
        let new_n = hunk.iter().filter(|o| o.0 != '-').count();
        out.push_str(&format!(
            "@@ -{},{old_n} +{},{new_n} @@\n",
            hunk[0].1 + 1,
            hunk[0].2 + 1
        ));
        for &(tag, oi, nj) in hunk {
            let line = if tag == '+' { b[nj] } else { a[oi] };
            out.push(tag);
            out.push_str(line);
            out.push('\n');
        }
        k = end;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_line_is_shown_with_its_context() {
        let old = "a\nb\nc\nd\ne\nf\ng\nh\n";
        let new = "a\nb\nc\nd\nE\nf\ng\nh\n";
        assert_eq!(
            unified(old, new).unwrap(),
            "@@ -2,7 +2,7 @@\n b\n c\n d\n-e\n+E\n f\n g\n h\n"
        );
        assert_eq!(unified(old, old).unwrap(), "");
    }

    #[test]
    fn additions_and_removals_far_apart_make_two_hunks() {
        let lines: Vec<String> = (0..30).map(|i| format!("line{i}")).collect();
        let old = lines.join("\n");
        let mut changed: Vec<String> = lines.iter().filter(|l| *l != "line2").cloned().collect();
        let at = changed.iter().position(|l| l == "line25").unwrap();
        changed.insert(at + 1, "new".into());
        let d = unified(&old, &changed.join("\n")).unwrap();
        assert_eq!(d.matches("@@ -").count(), 2, "{d}");
        assert!(d.contains("-line2\n") && d.contains("+new\n"), "{d}");
    }
}
