//! Reading signatures out of the query and the `Cookie` fields, raw (never
//! percent-decoded: the signed bytes are the bytes on the wire).

/// The value of the first query argument called `name`, compared without regard to ASCII
/// case, as nginx's `$arg_NAME` does. An argument without `=` has no value and does not
/// count; `name=` gives an empty value.
pub(crate) fn query_arg<'q>(query: &'q [u8], name: &[u8]) -> Option<&'q [u8]> {
    query.split(|&b| b == b'&').find_map(|arg| {
        let eq = arg.iter().position(|&b| b == b'=')?;
        arg[..eq].eq_ignore_ascii_case(name).then(|| &arg[eq + 1..])
    })
}

/// The values of every cookie called `name` (case-sensitive, RFC 6265) across the
/// request's `Cookie` fields, in order, with surrounding double quotes removed.
pub(crate) fn cookies<'c>(fields: &'c [&'c [u8]], name: &'c [u8]) -> impl Iterator<Item = &'c [u8]> + 'c {
    fields.iter().flat_map(|field| field.split(|&b| b == b';')).filter_map(move |pair| {
        let eq = pair.iter().position(|&b| b == b'=')?;
        if trim(&pair[..eq]) != name {
            return None;
        }
        let value = trim(&pair[eq + 1..]);
        Some(match value {
            [b'"', inner @ .., b'"'] => inner,
            _ => value,
        })
    })
}

fn trim(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

/// A query argument name this crate accepts in a policy: RFC 3986 unreserved characters,
/// which no client escapes.
pub(crate) fn valid_arg_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b))
}

/// An RFC 6265 cookie name (an RFC 7230 token).
pub(crate) fn valid_cookie_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_args_like_nginx() {
        let q = b"a=1&MD5=abc&md5=second&expires=&flag&x=y=z";
        assert_eq!(query_arg(q, b"md5"), Some(&b"abc"[..]), "first match, any case");
        assert_eq!(query_arg(q, b"expires"), Some(&b""[..]));
        assert_eq!(query_arg(q, b"flag"), None, "no `=`, no value");
        assert_eq!(query_arg(q, b"x"), Some(&b"y=z"[..]));
        assert_eq!(query_arg(q, b"y"), None);
        assert_eq!(query_arg(b"", b"a"), None);
        assert_eq!(query_arg(b"xa=1", b"a"), None, "names match whole");
        assert_eq!(query_arg(b"a%3D1=2", b"a"), None, "no decoding");
    }

    #[test]
    fn cookie_values() {
        let fields: [&[u8]; 3] = [b"a=1; __token__=one;b=2", b"__token__ = \"two\" ;__TOKEN__=no", b"__token__"];
        let got: Vec<&[u8]> = cookies(&fields, b"__token__").collect();
        assert_eq!(got, [&b"one"[..], b"two"]);
        let none: [&[u8]; 0] = [];
        assert_eq!(cookies(&none, b"a").count(), 0);
        let eq: [&[u8]; 1] = [b"t=st=1~exp=2=3"];
        assert_eq!(cookies(&eq, b"t").collect::<Vec<_>>(), [&b"st=1~exp=2=3"[..]], "value runs to the `;`");
    }

    #[test]
    fn names() {
        assert!(valid_arg_name("__token__") && valid_arg_name("md5") && valid_arg_name("e.x-p~"));
        for bad in ["", "a&b", "a=b", "a b", "a%20", "a#", "a+b", &"a".repeat(65)] {
            assert!(!valid_arg_name(bad), "{bad}");
        }
        assert!(valid_cookie_name("__token__") && valid_cookie_name("hdnts") && valid_cookie_name("a!#$%&'*+-.^_`|~"));
        for bad in ["", "a=b", "a;b", "a b", "a,b", "a\"", "a/b", "é"] {
            assert!(!valid_cookie_name(bad), "{bad}");
        }
    }
}
