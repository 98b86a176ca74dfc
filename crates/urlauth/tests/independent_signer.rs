//! Signatures made by independent signers (openssl, Python's hmac/hashlib, Akamai's own
//! EdgeAuth library), pasted as constants with the command that made each.

use std::net::IpAddr;

use linerate_urlauth::{Key, Policy, Reason, Request, SecureLink, SecureLinkSpec, TokenAuth, TokenSpec, Verdict};

/// Inside every token's validity window below.
const NOW: u64 = 1_700_001_800;

fn addr(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn request<'a>(path: &'a str, query: Option<&'a str>, cookies: &'a [&'a [u8]], client: &str, now: u64) -> Request<'a> {
    Request { path: path.as_bytes(), query: query.map(str::as_bytes), cookies, client: addr(client), now }
}

/// A request with only a query; `query` may be any bytes.
fn query(path: &str, query: impl AsRef<[u8]>, client: &str, now: u64) -> Request<'static> {
    let path: &'static str = Box::leak(path.to_string().into_boxed_str());
    let query: &'static [u8] = Box::leak(query.as_ref().to_vec().into_boxed_slice());
    Request { path: path.as_bytes(), query: Some(query), cookies: &[], client: addr(client), now }
}

// ---------------------------------------------------------------------------------------
// nginx secure_link mode
// ---------------------------------------------------------------------------------------

fn secure_link(expression: &str, keys: &[(&str, &str)]) -> Policy {
    Policy::SecureLink(
        SecureLink::new(SecureLinkSpec {
            expression: expression.into(),
            keys: keys.iter().map(|(id, s)| Key::new(*id, s.as_bytes().to_vec()).unwrap()).collect(),
            ..Default::default()
        })
        .unwrap(),
    )
}

/// `echo -n '2147483647/s/link127.0.0.1 secret' | openssl md5 -binary | openssl base64 | tr +/ -_ | tr -d =`
/// (the example in nginx's secure_link documentation, which prints the same value).
const NGINX_DOC_HASH: &str = "_e4Nc3iduzkWRm01TBBNYw";

/// `echo -n '1700003600/premium/movie.mp4198.51.100.4 k1-md5-secret' | openssl md5 -binary | openssl base64 | tr +/ -_ | tr -d =`
const MOVIE_K1: &str = "k2vlu4OMv32opRV4hIFI3A";
/// `echo -n '1700003600/premium/movie.mp4198.51.100.4 k2-md5-secret' | openssl md5 -binary | openssl base64 | tr +/ -_ | tr -d =`
const MOVIE_K2: &str = "AbI7hisH005kuMrdumoxww";
/// `echo -n '1700003600/premium/movie.mp42001:db8::4 k1-md5-secret' | openssl md5 -binary | openssl base64 | tr +/ -_ | tr -d =`
const MOVIE_K1_V6: &str = "9t4itvMbjA81PyfxjuzNeQ";
/// `echo -n '1700003600/premium/dir/ k1-md5-secret' | openssl md5 -binary | openssl base64 | tr +/ -_ | tr -d =`
const DIR_K1: &str = "gIUTetoDoMSEQ0_l6kjTVA";
/// `echo -n '/premium/movie.mp4 k1-md5-secret' | openssl md5 -binary | openssl base64 | tr +/ -_ | tr -d =`
const NO_EXPIRY_K1: &str = "wJlYNrS3Zr9BIyUj1yNcYg";
/// `echo -n '1700003600/premium/a b.mp4 k1-md5-secret' | openssl md5 -binary | openssl base64 | tr +/ -_ | tr -d =`
const SPACE_K1: &str = "CGtbO2B5x88Y-6yj3zmPLQ";

const ROTATING: &str = "$secure_link_expires$uri$remote_addr $secret";
const K1_MD5: (&str, &str) = ("k1", "k1-md5-secret");
const K2_MD5: (&str, &str) = ("k2", "k2-md5-secret");

#[test]
fn nginx_documentation_example() {
    let policy = secure_link("$secure_link_expires$uri$remote_addr secret", &[]);
    let q = format!("md5={NGINX_DOC_HASH}&expires=2147483647");
    assert_eq!(policy.check(&query("/s/link", &q, "127.0.0.1", NOW)), Verdict::Allow);
    assert_eq!(policy.check(&query("/s/link", &q, "127.0.0.2", NOW)), Verdict::Deny(Reason::BadSignature));
    assert_eq!(policy.check(&query("/s/linK", &q, "127.0.0.1", NOW)), Verdict::Deny(Reason::BadSignature));
    let padded = format!("md5={NGINX_DOC_HASH}==&expires=2147483647");
    assert_eq!(policy.check(&query("/s/link", &padded, "127.0.0.1", NOW)), Verdict::Allow);
}

#[test]
fn secure_link_good_expired_missing_and_wrong() {
    let policy = secure_link(ROTATING, &[K1_MD5]);
    let good = format!("md5={MOVIE_K1}&expires=1700003600");
    let ok = |q: &str, now| policy.check(&query("/premium/movie.mp4", q, "198.51.100.4", now));
    assert_eq!(ok(&good, NOW), Verdict::Allow);
    assert_eq!(ok(&format!("other=1&expires=1700003600&MD5={MOVIE_K1}"), NOW), Verdict::Allow, "any order, any case");
    assert_eq!(ok(&good, 1_700_003_600), Verdict::Allow, "valid through its expiry second, as nginx");
    assert_eq!(ok(&good, 1_700_003_601), Verdict::Expired);
    assert_eq!(Verdict::Expired.status(), Some(410));
    assert_eq!(ok("expires=1700003600", NOW), Verdict::Deny(Reason::Missing));
    assert_eq!(ok(&format!("md5={MOVIE_K1}"), NOW), Verdict::Deny(Reason::Missing));
    assert_eq!(ok(&format!("md5={MOVIE_K1}&expires="), NOW), Verdict::Deny(Reason::Missing));
    assert_eq!(ok("md5=&expires=1700003600", NOW), Verdict::Deny(Reason::Missing));
    assert_eq!(
        policy.check(&request("/premium/movie.mp4", None, &[], "198.51.100.4", NOW)),
        Verdict::Deny(Reason::Missing)
    );
    assert_eq!(ok(&format!("md5={MOVIE_K1}&expires=0"), NOW), Verdict::Deny(Reason::Malformed));
    assert_eq!(ok(&format!("md5={MOVIE_K1}&expires=17e8"), NOW), Verdict::Deny(Reason::Malformed));
    assert_eq!(ok("md5=abc&expires=1700003600", NOW), Verdict::Deny(Reason::Malformed));
    // A later expiry written by the client: the hash no longer matches.
    assert_eq!(ok(&format!("md5={MOVIE_K1}&expires=1800003600"), NOW), Verdict::Deny(Reason::BadSignature));
    // The same link from another client, or for another file.
    assert_eq!(
        policy.check(&query("/premium/movie.mp4", &good, "198.51.100.5", NOW)),
        Verdict::Deny(Reason::BadSignature)
    );
    assert_eq!(
        policy.check(&query("/premium/movie2.mp4", &good, "198.51.100.4", NOW)),
        Verdict::Deny(Reason::BadSignature)
    );
}

#[test]
fn secure_link_ipv6_directories_and_decoded_paths() {
    let policy = secure_link(ROTATING, &[K1_MD5]);
    let q = format!("md5={MOVIE_K1_V6}&expires=1700003600");
    assert_eq!(policy.check(&query("/premium/movie.mp4", &q, "2001:db8::4", NOW)), Verdict::Allow);
    assert_eq!(policy.check(&query("/premium/movie.mp4", &q, "2001:0db8:0:0::4", NOW)), Verdict::Allow);

    let no_addr = secure_link("$secure_link_expires$uri $secret", &[K1_MD5]);
    let q = format!("md5={DIR_K1}&expires=1700003600");
    assert_eq!(no_addr.check(&query("/premium/dir/", &q, "192.0.2.1", NOW)), Verdict::Allow);
    assert_eq!(no_addr.check(&query("/premium/dir", &q, "192.0.2.1", NOW)), Verdict::Deny(Reason::BadSignature));
    // `$uri` is the decoded path: the server passes `/premium/a b.mp4` for `/premium/a%20b.mp4`.
    let q = format!("md5={SPACE_K1}&expires=1700003600");
    assert_eq!(no_addr.check(&query("/premium/a b.mp4", &q, "192.0.2.1", NOW)), Verdict::Allow);
}

#[test]
fn secure_link_without_expiry() {
    let policy = Policy::SecureLink(
        SecureLink::new(SecureLinkSpec {
            expression: "$uri $secret".into(),
            keys: vec![Key::new("k1", b"k1-md5-secret".to_vec()).unwrap()],
            expires_arg: None,
            ..Default::default()
        })
        .unwrap(),
    );
    let q = format!("md5={NO_EXPIRY_K1}");
    assert_eq!(policy.check(&query("/premium/movie.mp4", &q, "192.0.2.1", u64::MAX)), Verdict::Allow);
}

#[test]
fn secure_link_key_rotation() {
    let q1 = format!("md5={MOVIE_K1}&expires=1700003600");
    let q2 = format!("md5={MOVIE_K2}&expires=1700003600");
    let check = |policy: &Policy, q: &str| policy.check(&query("/premium/movie.mp4", q, "198.51.100.4", NOW));
    let old = secure_link(ROTATING, &[K1_MD5]);
    let both = secure_link(ROTATING, &[K1_MD5, K2_MD5]);
    let new = secure_link(ROTATING, &[K2_MD5]);
    assert_eq!(check(&old, &q1), Verdict::Allow);
    assert_eq!(check(&old, &q2), Verdict::Deny(Reason::BadSignature));
    assert_eq!(check(&both, &q1), Verdict::Allow);
    assert_eq!(check(&both, &q2), Verdict::Allow);
    assert_eq!(check(&new, &q1), Verdict::Deny(Reason::BadSignature));
    assert_eq!(check(&new, &q2), Verdict::Allow);
}

#[test]
fn secure_link_any_single_byte_change_is_denied() {
    let policy = secure_link(ROTATING, &[K1_MD5]);
    for (arg, value) in [("md5", MOVIE_K1), ("expires", "1700003600")] {
        let other = if arg == "md5" { "expires=1700003600".to_string() } else { format!("md5={MOVIE_K1}") };
        for mutated in mutations(value.as_bytes()) {
            let q = [format!("{other}&{arg}=").as_bytes(), &mutated].concat();
            let verdict = policy.check(&query("/premium/movie.mp4", q, "198.51.100.4", NOW));
            assert_ne!(verdict, Verdict::Allow, "{arg}={:?}", String::from_utf8_lossy(&mutated));
            assert_ne!(verdict, Verdict::Expired, "{arg}={:?}", String::from_utf8_lossy(&mutated));
        }
    }
}

// ---------------------------------------------------------------------------------------
// HMAC-SHA256 token mode
// ---------------------------------------------------------------------------------------

const K1: (&str, &[u8]) = ("k1", b"k1-secret-0123456789abcdef012345");
const K2: (&str, &[u8]) = ("k2", b"k2-secret-fedcba9876543210fedcba");

// The tokens below were made by this Python signer (docs/SIGNED-URLS.md has the same):
//
// import hmac, hashlib
// def sign(kid, secret, acl, exp, st=None, ip=None):
//     fields = []
//     if ip is not None: fields.append(f"ip={ip}")
//     if st is not None: fields.append(f"st={st}")
//     fields.append(f"exp={exp}")
//     fields.append(f"acl={acl}")
//     if kid is not None: fields.append(f"kid={kid}")
//     signed = "~".join(fields)
//     mac = hmac.new(secret, signed.encode(), hashlib.sha256).hexdigest()
//     return f"{signed}~hmac={mac}"
// K1 = b"k1-secret-0123456789abcdef012345"
// K2 = b"k2-secret-fedcba9876543210fedcba"

/// `sign("k1", K1, "/premium/title1/*", 1700003600, st=1700000000)`
const TITLE1: &str = "st=1700000000~exp=1700003600~acl=/premium/title1/*~kid=k1~hmac=93c62bd8f8ae89aed805e5891dadeed41d3a216e4729a9ed8d3642a8fe9798a7";
/// `sign("k2", K2, "/premium/*", 1700003600, ip="192.0.2.7")`
const IP4: &str =
    "ip=192.0.2.7~exp=1700003600~acl=/premium/*~kid=k2~hmac=8068186ac09cfad8b61314085691b29dcbe3ba4498f5fc596cb8c600bd677e33";
/// `sign("k1", K1, "/premium/*", 1700003600, ip="2001:db8::7")`
const IP6: &str =
    "ip=2001:db8::7~exp=1700003600~acl=/premium/*~kid=k1~hmac=5be91833763c0b952f5c4802999634f43a16d76880141ad056bdcd56daea70ed";
/// `sign("k1", K1, "/premium/a.mp4!/premium/b/*.m4s", 1700003600)`
const MULTI: &str = "exp=1700003600~acl=/premium/a.mp4!/premium/b/*.m4s~kid=k1~hmac=42a1effcd2598345a228d49883e6a8818721774937e70d559fd93db865196563";
/// `sign(None, K2, "/premium/*", 1700003600)`
const NO_KID: &str =
    "exp=1700003600~acl=/premium/*~hmac=6e00f07dc775c19a3ec946ffdda9c549cec6d9c1dc5ccc9f1d1595ecb4c6e4a4";
/// `sign("k1", K1, "/premium/a%20b/*", 1700003600)`
const ESCAPED: &str =
    "exp=1700003600~acl=/premium/a%20b/*~kid=k1~hmac=960a2cd3d45e39386c12cd4be1f922e8a87e7ac0c55827cc2a268c6faf7eef64";
/// `sign("k3", K1, "/premium/*", 1700003600)`: a key id that is not configured.
const KID3: &str =
    "exp=1700003600~acl=/premium/*~kid=k3~hmac=bb72514867893fad059bb0725ee02f61b5865c7df60f006f373ae58e2d83089d";

// Akamai's own signer (`pip install akamai-edgeauth==0.3.2`), with its hex key:
//
// from akamai.edgeauth import EdgeAuth
// key = '00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff'
// EdgeAuth(key=key, start_time=1700000000, end_time=1700003600).generate_acl_token('/premium/title2/*')
// EdgeAuth(key=key, start_time=1700000000, end_time=1700003600, ip='192.0.2.7').generate_acl_token(
//     ['/premium/title2/*', '/premium/extra.mp4'])
const EDGEAUTH_KEY: [u8; 32] = [
    0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff, 0x00, 0x11, 0x22,
    0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff,
];
const EDGEAUTH_TITLE2: &str =
    "st=1700000000~exp=1700003600~acl=/premium/title2/*~hmac=bdc5f21e8601699ce580ab88d8e102ff0a6e64709e241748b9838c1551832c95";
const EDGEAUTH_LIST: &str = "ip=192.0.2.7~st=1700000000~exp=1700003600~acl=/premium/title2/*!/premium/extra.mp4~hmac=458e4966b3900d9c797a11c622572a4df868402d427e9a25a8ee5eb504a321c1";

fn tokens(keys: &[(&str, &[u8])]) -> Policy {
    tokens_with(keys, TokenSpec::default())
}

fn tokens_with(keys: &[(&str, &[u8])], spec: TokenSpec) -> Policy {
    let keys = keys.iter().map(|(id, s)| Key::new(*id, s.to_vec()).unwrap()).collect();
    Policy::Token(TokenAuth::new(TokenSpec { keys, ..spec }).unwrap())
}

fn token_query(policy: &Policy, path: &str, token: &str, client: &str, now: u64) -> Verdict {
    policy.check(&query(path, format!("__token__={token}"), client, now))
}

fn token_cookie(policy: &Policy, path: &str, token: &str, client: &str, now: u64) -> Verdict {
    let field = format!("session=abc; __token__={token}; theme=dark");
    policy.check(&request(path, None, &[field.as_bytes()], client, now))
}

#[test]
fn a_title_token_covers_the_manifest_and_every_segment() {
    let policy = tokens(&[K1, K2]);
    for path in [
        "/premium/title1/master.m3u8",
        "/premium/title1/v1080/index.m3u8",
        "/premium/title1/v1080/seg-00001.m4s",
        "/premium/title1/manifest.mpd",
        "/premium/title1/audio/en/init.mp4",
    ] {
        assert_eq!(token_query(&policy, path, TITLE1, "192.0.2.1", NOW), Verdict::Allow, "{path}");
        assert_eq!(token_cookie(&policy, path, TITLE1, "192.0.2.1", NOW), Verdict::Allow, "{path}");
    }
    for path in ["/premium/title2/master.m3u8", "/premium/title10/seg-1.m4s", "/premium/title1", "/free/title1/a.m4s"] {
        assert_eq!(
            token_query(&policy, path, TITLE1, "192.0.2.1", NOW),
            Verdict::Deny(Reason::PathNotCovered),
            "{path}"
        );
    }
}

#[test]
fn token_times() {
    let policy = tokens(&[K1]);
    let at = |now| token_query(&policy, "/premium/title1/a.m4s", TITLE1, "192.0.2.1", now);
    assert_eq!(at(1_700_000_000), Verdict::Allow);
    assert_eq!(at(1_700_003_600), Verdict::Allow);
    assert_eq!(at(1_699_999_999), Verdict::Deny(Reason::NotYetValid));
    assert_eq!(Verdict::Deny(Reason::NotYetValid).status(), Some(403));
    assert_eq!(at(1_700_003_601), Verdict::Expired);

    let lenient = tokens_with(&[K1], TokenSpec { leeway: 30, ..Default::default() });
    let at = |now| token_query(&lenient, "/premium/title1/a.m4s", TITLE1, "192.0.2.1", now);
    assert_eq!(at(1_699_999_970), Verdict::Allow);
    assert_eq!(at(1_699_999_969), Verdict::Deny(Reason::NotYetValid));
    assert_eq!(at(1_700_003_630), Verdict::Allow);
    assert_eq!(at(1_700_003_631), Verdict::Expired);
}

#[test]
fn token_key_ids_and_rotation() {
    let old = tokens(&[K1]);
    let both = tokens(&[K1, K2]);
    let new = tokens(&[K2]);
    let check = |p: &Policy, token| token_query(p, "/premium/title1/a.m4s", token, "192.0.2.7", NOW);
    assert_eq!(check(&old, TITLE1), Verdict::Allow);
    assert_eq!(check(&old, IP4), Verdict::Deny(Reason::UnknownKey));
    assert_eq!(check(&both, TITLE1), Verdict::Allow);
    assert_eq!(check(&both, IP4), Verdict::Allow);
    assert_eq!(check(&new, TITLE1), Verdict::Deny(Reason::UnknownKey));
    assert_eq!(check(&new, IP4), Verdict::Allow);
    // No key id: every configured key is tried.
    assert_eq!(check(&both, NO_KID), Verdict::Allow);
    assert_eq!(check(&new, NO_KID), Verdict::Allow);
    assert_eq!(check(&old, NO_KID), Verdict::Deny(Reason::BadSignature));
    // A key id nobody configured, and a known id with another key's signature.
    assert_eq!(check(&both, KID3), Verdict::Deny(Reason::UnknownKey));
    let swapped = TITLE1.replace("kid=k1", "kid=k2");
    assert_eq!(check(&both, &swapped), Verdict::Deny(Reason::BadSignature));
    // Same id, another secret: a key replaced without changing its id.
    let replaced = tokens(&[("k1", b"k1-secret-replaced-0123456789abc")]);
    assert_eq!(check(&replaced, TITLE1), Verdict::Deny(Reason::BadSignature));
}

#[test]
fn token_client_address_binding() {
    let policy = tokens(&[K1, K2]);
    assert_eq!(token_query(&policy, "/premium/x.mp4", IP4, "192.0.2.7", NOW), Verdict::Allow);
    assert_eq!(token_query(&policy, "/premium/x.mp4", IP4, "::ffff:192.0.2.7", NOW), Verdict::Allow);
    assert_eq!(token_query(&policy, "/premium/x.mp4", IP4, "192.0.2.8", NOW), Verdict::Deny(Reason::AddressMismatch));
    assert_eq!(token_query(&policy, "/premium/x.mp4", IP6, "2001:db8:0::7", NOW), Verdict::Allow);
    assert_eq!(token_query(&policy, "/premium/x.mp4", IP6, "2001:db8::8", NOW), Verdict::Deny(Reason::AddressMismatch));
    // Not covered beats the address: the token is for other paths anyway.
    assert_eq!(token_query(&policy, "/other/x.mp4", IP4, "192.0.2.8", NOW), Verdict::Deny(Reason::PathNotCovered));

    let strict = tokens_with(&[K1, K2], TokenSpec { require_client_address: true, ..Default::default() });
    assert_eq!(token_query(&strict, "/premium/x.mp4", IP4, "192.0.2.7", NOW), Verdict::Allow);
    assert_eq!(
        token_query(&strict, "/premium/title1/x.m4s", TITLE1, "192.0.2.7", NOW),
        Verdict::Deny(Reason::AddressRequired)
    );
}

#[test]
fn token_acl_lists_and_escapes() {
    let policy = tokens(&[K1]);
    let check = |path| token_query(&policy, path, MULTI, "192.0.2.1", NOW);
    assert_eq!(check("/premium/a.mp4"), Verdict::Allow);
    assert_eq!(check("/premium/b/v1/seg-7.m4s"), Verdict::Allow);
    assert_eq!(check("/premium/b/v1/init.mp4"), Verdict::Deny(Reason::PathNotCovered));
    assert_eq!(check("/premium/a.mp4.bak"), Verdict::Deny(Reason::PathNotCovered));
    let check = |path| token_query(&policy, path, ESCAPED, "192.0.2.1", NOW);
    assert_eq!(check("/premium/a b/seg.ts"), Verdict::Allow);
    assert_eq!(check("/premium/a%20b/seg.ts"), Verdict::Deny(Reason::PathNotCovered));
}

#[test]
fn tokens_from_akamai_edgeauth() {
    let policy = tokens(&[("edge", &EDGEAUTH_KEY)]);
    let check = |path, token, client| token_cookie(&policy, path, token, client, NOW);
    assert_eq!(check("/premium/title2/index.m3u8", EDGEAUTH_TITLE2, "192.0.2.1"), Verdict::Allow);
    assert_eq!(
        check("/premium/title1/index.m3u8", EDGEAUTH_TITLE2, "192.0.2.1"),
        Verdict::Deny(Reason::PathNotCovered)
    );
    assert_eq!(check("/premium/extra.mp4", EDGEAUTH_LIST, "192.0.2.7"), Verdict::Allow);
    assert_eq!(check("/premium/title2/seg-1.ts", EDGEAUTH_LIST, "192.0.2.7"), Verdict::Allow);
    assert_eq!(check("/premium/extra.mp4", EDGEAUTH_LIST, "192.0.2.1"), Verdict::Deny(Reason::AddressMismatch));
}

#[test]
fn token_carriers() {
    let policy = tokens(&[K1, K2]);
    let path = "/premium/title1/seg-1.m4s";
    // Several cookies of the name (one per title, set with different Path attributes):
    // the one that allows wins, wherever it is.
    let fields: [&[u8]; 2] =
        [format!("__token__={MULTI}").leak().as_bytes(), format!("__token__={TITLE1}").leak().as_bytes()];
    assert_eq!(policy.check(&request(path, None, &fields, "192.0.2.1", NOW)), Verdict::Allow);
    // A bad query token does not hide a good cookie.
    assert_eq!(policy.check(&request(path, Some("__token__=junk"), &fields, "192.0.2.1", NOW)), Verdict::Allow);
    // Nothing allows: the answer is the candidate that got furthest (an expired one).
    let later = 1_700_003_601;
    assert_eq!(policy.check(&request(path, Some("__token__=junk"), &fields, "192.0.2.1", later)), Verdict::Expired);
    // Quoted cookie values.
    let quoted = format!("__token__=\"{TITLE1}\"");
    assert_eq!(policy.check(&request(path, None, &[quoted.as_bytes()], "192.0.2.1", NOW)), Verdict::Allow);
    // Nothing offered, or an empty value.
    assert_eq!(policy.check(&request(path, None, &[], "192.0.2.1", NOW)), Verdict::Deny(Reason::Missing));
    assert_eq!(
        policy.check(&request(path, Some("__token__="), &[b"__token__="], "192.0.2.1", NOW)),
        Verdict::Deny(Reason::Missing)
    );
    // Carriers that are switched off are not read.
    let query_only = tokens_with(&[K1], TokenSpec { cookie: None, ..Default::default() });
    assert_eq!(token_cookie(&query_only, path, TITLE1, "192.0.2.1", NOW), Verdict::Deny(Reason::Missing));
    assert_eq!(token_query(&query_only, path, TITLE1, "192.0.2.1", NOW), Verdict::Allow);
    let named = tokens_with(
        &[K1],
        TokenSpec { query_arg: Some("hdnts".into()), cookie: Some("hdnts".into()), ..Default::default() },
    );
    assert_eq!(named.check(&query(path, format!("hdnts={TITLE1}"), "192.0.2.1", NOW)), Verdict::Allow);
    assert_eq!(token_query(&named, path, TITLE1, "192.0.2.1", NOW), Verdict::Deny(Reason::Missing));
}

#[test]
fn token_any_single_byte_change_is_denied() {
    let policy = tokens(&[K1, K2]);
    for token in [TITLE1, IP4, NO_KID] {
        for mutated in mutations(token.as_bytes()) {
            // Through the cookie, the carrier that takes any byte but `;`.
            let field = [&b"__token__="[..], &mutated].concat();
            let fields = [&field[..]];
            let verdict = policy.check(&request("/premium/title1/seg-1.m4s", None, &fields, "192.0.2.7", NOW));
            assert!(matches!(verdict, Verdict::Deny(_)), "{:?} gave {verdict:?}", String::from_utf8_lossy(&mutated));
        }
    }
}

/// Every token one byte away from `original`: each byte replaced by each other value,
/// each byte deleted, and each of a few bytes inserted at each position. (Not spaces:
/// around a cookie value they are the field's syntax, not the token's.)
fn mutations(original: &[u8]) -> impl Iterator<Item = Vec<u8>> + '_ {
    let replaced = (0..original.len()).flat_map(move |i| {
        (0..=255u8).filter(move |&b| b != original[i]).map(move |b| {
            let mut m = original.to_vec();
            m[i] = b;
            m
        })
    });
    let deleted = (0..original.len()).map(move |i| [&original[..i], &original[i + 1..]].concat());
    let inserted = (0..=original.len()).flat_map(move |i| {
        [b'0', b'a', b'A', b'=', b'~', b'*', b'/', b'%', b'!', 0xff]
            .into_iter()
            .map(move |b| [&original[..i], &[b], &original[i..]].concat())
    });
    replaced.chain(deleted).chain(inserted)
}
