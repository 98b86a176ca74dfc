//! S3 origins (`[origin.s3]`): the URL a bucket is reached at, and AWS
//! Signature Version 4 on every request to it, computed by `aws-sigv4`.
//!
//! **Addressing.** The table's URL is the S3 endpoint; its path, if any, is a key
//! prefix. Path-style puts the bucket first in the path
//! (`http://endpoint/bucket/prefix/key`), virtual-hosted in the host name
//! (`http://bucket.endpoint/prefix/key`: connection, SNI and `Host`).
//!
//! **Signing.** The request linerate built (method, path, `Host`, `Range`,
//! validators, the forwarded fields) gets `x-amz-date`,
//! `x-amz-content-sha256: UNSIGNED-PAYLOAD` (S3's value for a request whose body
//! is not hashed; these have none), `x-amz-security-token` with a session token,
//! and `Authorization`. Every field of the request is signed but `User-Agent`
//! (which `aws-sigv4` leaves out, as proxies rewrite it). The path is sent
//! encoded as S3 expects it (every byte but `A-Za-z0-9-._~/` as `%XX`) and signed
//! as sent: single encoding, no normalisation.
//!
//! **Credentials** are the ones the configuration read (at start), swapped in
//! place at every reload ([`Signer::set_credentials`]): a rotated key file takes
//! effect with a SIGHUP, without dropping a connection.

use std::sync::Arc;
use std::time::SystemTime;

use arc_swap::ArcSwap;
use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    sign, PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings,
    UriPathNormalizationMode,
};
use aws_sigv4::sign::v4;

use crate::config::{Addressing, BaseUrl, S3Credentials, S3};

/// The signer of one S3 table.
pub(super) struct Signer {
    pub(super) bucket: String,
    region: String,
    credentials: ArcSwap<S3Credentials>,
}

impl Signer {
    pub(super) fn new(s3: &S3, credentials: Arc<S3Credentials>) -> Signer {
        Signer { bucket: s3.bucket.clone(), region: s3.region.clone(), credentials: ArcSwap::new(credentials) }
    }

    /// The credentials a reload read.
    pub(super) fn set_credentials(&self, credentials: Arc<S3Credentials>) {
        self.credentials.store(credentials);
    }

    /// The access key id in use (not a secret: it names the key), and where it
    /// was read from, for logs.
    pub(super) fn key_in_use(&self) -> (String, String) {
        let c = self.credentials.load();
        (c.access_key_id.clone(), c.source.clone())
    }

    /// Signs `req` as of `time`: adds `x-amz-date`, `x-amz-content-sha256`,
    /// `x-amz-security-token` (with a session token) and `Authorization`. The
    /// request's target must be encoded as S3 expects (the origin client's S3
    /// encoding) and its `Host` set.
    pub(super) fn sign<B>(&self, req: &mut http::Request<B>, time: SystemTime) -> Result<(), String> {
        let c = self.credentials.load();
        let identity = Credentials::new(
            c.access_key_id.clone(),
            c.secret_access_key.0.clone(),
            c.session_token.as_ref().map(|t| t.0.clone()),
            None,
            "linerate",
        )
        .into();
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.region)
            .name("s3")
            .time(time)
            .settings(signing_settings())
            .build()
            .map_err(|e| format!("S3 signing parameters: {e}"))?
            .into();
        // Fields whose value is not text (a forwarded viewer field with Latin-1
        // bytes) go unsigned: S3 checks only the fields a signature names.
        let headers = req.headers().iter().filter_map(|(n, v)| Some((n.as_str(), v.to_str().ok()?)));
        let target = req.uri().path_and_query().map_or("/", |p| p.as_str());
        let signable = SignableRequest::new(req.method().as_str(), target, headers, SignableBody::UnsignedPayload)
            .map_err(|e| format!("S3 signing: {e}"))?;
        let (instructions, _signature) = sign(signable, &params).map_err(|e| format!("S3 signing: {e}"))?.into_parts();
        instructions.apply_to_request_http1x(req);
        Ok(())
    }
}

/// Where a table's URL sends requests for its bucket: path-style, the bucket
/// first in the path; virtual-hosted, the bucket first in the host name. The
/// URL's own path stays a key prefix.
pub(super) fn bucket_url(endpoint: &BaseUrl, s3: &S3) -> BaseUrl {
    let mut url = endpoint.clone();
    match s3.addressing {
        Addressing::Path => url.path = format!("/{}{}", s3.bucket, endpoint.path),
        Addressing::Virtual => url.host = format!("{}.{}", s3.bucket, endpoint.host),
    }
    url
}

/// The `<Code>` of an S3 error body (`SignatureDoesNotMatch`,
/// `InvalidAccessKeyId`, `AccessDenied`...), when it has one that reads as a
/// code.
pub(super) fn error_code(body: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(body).ok()?;
    let start = text.find("<Code>")? + "<Code>".len();
    let len = text[start..].find("</Code>")?;
    let code = &text[start..start + len];
    (!code.is_empty() && code.len() <= 64 && code.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.'))
        .then_some(code)
}

/// How S3 wants a request signed: the `x-amz-content-sha256` field, the path
/// encoded once (the client already encoded it as S3 does) and not normalised.
fn signing_settings() -> SigningSettings {
    let mut settings = SigningSettings::default();
    settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
    settings.percent_encoding_mode = PercentEncodingMode::Single;
    settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
    settings
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;
    use http::header::HeaderValue;
    use http_body_util::Empty;

    use super::*;
    use crate::config::{parse_base_url, Secret};
    use crate::origin::request::{host_field, OriginRequest, PathEncoding};

    /// AWS's own S3 example (the SigV4 documentation's "GET Object" with a
    /// range): access key, secret, bucket `examplebucket`, 24 May 2013.
    const AKID: &str = "AKIAIOSFODNN7EXAMPLE";
    const SECRET: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";

    fn s3(addressing: Addressing) -> S3 {
        S3 {
            bucket: "examplebucket".into(),
            region: "us-east-1".into(),
            addressing,
            credentials_file: None,
            profile: "default".into(),
        }
    }

    fn signer(token: Option<&str>) -> Signer {
        let c = S3Credentials {
            access_key_id: AKID.into(),
            secret_access_key: Secret(SECRET.into()),
            session_token: token.map(|t| Secret(t.into())),
            source: "test".into(),
        };
        Signer::new(&s3(Addressing::Virtual), Arc::new(c))
    }

    fn example_time() -> SystemTime {
        // 20130524T000000Z
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_369_353_600)
    }

    /// A request as the origin client builds it for `endpoint`, the bucket
    /// addressed as `addressing`.
    fn built(endpoint: &str, addressing: Addressing, req: &OriginRequest) -> http::Request<Empty<Bytes>> {
        let url = bucket_url(&parse_base_url(endpoint).unwrap(), &s3(addressing));
        let host = HeaderValue::from_str(&host_field(&url)).unwrap();
        req.build(&url.path, &host, &[], PathEncoding::S3).unwrap()
    }

    #[test]
    fn the_bucket_goes_in_the_path_or_the_host() {
        let get = OriginRequest { path: b"videos/a b+c.mp4".to_vec(), ..OriginRequest::default() };
        let r = built("http://127.0.0.1:8333/", Addressing::Path, &get);
        assert_eq!(r.uri(), "/examplebucket/videos/a%20b%2Bc.mp4");
        assert_eq!(r.headers()["host"], "127.0.0.1:8333");
        let r = built("https://s3.amazonaws.com/", Addressing::Virtual, &get);
        assert_eq!(r.uri(), "/videos/a%20b%2Bc.mp4");
        assert_eq!(r.headers()["host"], "examplebucket.s3.amazonaws.com");
        let r = built("https://s3.example.net:9000/library/", Addressing::Virtual, &get);
        assert_eq!(r.uri(), "/library/videos/a%20b%2Bc.mp4");
        assert_eq!(r.headers()["host"], "examplebucket.s3.example.net:9000");
        let r = built("http://[::1]:9000/library/", Addressing::Path, &get);
        assert_eq!(r.uri(), "/examplebucket/library/videos/a%20b%2Bc.mp4");
        assert_eq!(r.headers()["host"], "[::1]:9000");
        let url = bucket_url(&parse_base_url("https://s3.example.net/").unwrap(), &s3(Addressing::Virtual));
        assert_eq!((url.host.as_str(), url.port, url.https), ("examplebucket.s3.example.net", 443, true));
    }

    #[test]
    fn the_signature_is_aws_example_for_a_ranged_get() {
        // AWS's documented example: GET /test.txt, Range: bytes=0-9, from
        // examplebucket.s3.amazonaws.com, signed with x-amz-content-sha256 of the
        // empty body. linerate sends UNSIGNED-PAYLOAD instead, so the canonical
        // request differs in that one value; the example's own signature is
        // checked first with its inputs, through the same glue, to show the glue
        // hands aws-sigv4 the request as sent.
        let get = OriginRequest { path: b"test.txt".to_vec(), range: Some((0, 9)), ..OriginRequest::default() };
        let mut r = built("https://s3.amazonaws.com/", Addressing::Virtual, &get);
        // The example signs host, range, x-amz-content-sha256 and x-amz-date only.
        r.headers_mut().remove("user-agent");
        r.headers_mut().remove("accept-encoding");
        signer(None).sign(&mut r, example_time()).unwrap();
        let h = r.headers();
        assert_eq!(h["x-amz-date"], "20130524T000000Z");
        assert_eq!(h["x-amz-content-sha256"], "UNSIGNED-PAYLOAD");
        let auth = h["authorization"].to_str().unwrap();
        assert!(
            auth.starts_with(
                "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, \
                 SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, Signature="
            ),
            "{auth}"
        );
        assert!(!auth.contains(SECRET));
        // The same request with the example's payload hash gives the example's
        // signature: the glue signs exactly the path, host and range it sends.
        let expected = "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41";
        assert_eq!(example_signature(&r), expected);
    }

    /// The signature of `r` (as signed above) recomputed by aws-sigv4 with the
    /// example's empty-body hash instead of UNSIGNED-PAYLOAD.
    fn example_signature(r: &http::Request<Empty<Bytes>>) -> String {
        let identity = Credentials::new(AKID, SECRET, None, None, "test").into();
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region("us-east-1")
            .name("s3")
            .time(example_time())
            .settings(signing_settings())
            .build()
            .unwrap()
            .into();
        let headers =
            [("host", r.headers()["host"].to_str().unwrap()), ("range", r.headers()["range"].to_str().unwrap())];
        let signable =
            SignableRequest::new("GET", r.uri().path(), headers.into_iter(), SignableBody::Bytes(&[])).unwrap();
        sign(signable, &params).unwrap().into_parts().1
    }

    #[test]
    fn conditional_head_requests_sign_their_validators_and_token() {
        let head = OriginRequest {
            head: true,
            path: b"a.mp4".to_vec(),
            if_none_match: Some(b"\"abc\"".to_vec()),
            if_modified_since: Some(b"Fri, 24 May 2013 00:00:00 GMT".to_vec()),
            ..OriginRequest::default()
        };
        let mut r = built("http://127.0.0.1:9000/", Addressing::Path, &head);
        signer(Some("SESSIONTOKEN")).sign(&mut r, example_time()).unwrap();
        assert_eq!(r.method(), http::Method::HEAD);
        let h = r.headers();
        assert_eq!(h["x-amz-security-token"], "SESSIONTOKEN");
        let auth = h["authorization"].to_str().unwrap();
        assert!(
            auth.contains(
                "SignedHeaders=accept-encoding;host;if-modified-since;if-none-match;x-amz-content-sha256;x-amz-date;x-amz-security-token,"
            ),
            "{auth}"
        );
        assert!(!auth.contains("user-agent"), "User-Agent is not signed: {auth}");
        // Another time, another signature; the same time, the same one.
        let sig = |t| {
            let mut r = built("http://127.0.0.1:9000/", Addressing::Path, &head);
            signer(Some("SESSIONTOKEN")).sign(&mut r, t).unwrap();
            r.headers()["authorization"].to_str().unwrap().to_string()
        };
        assert_eq!(sig(example_time()), auth);
        assert_ne!(sig(example_time() + Duration::from_secs(1)), auth);
    }

    #[test]
    fn a_reload_swaps_the_key() {
        let s = signer(None);
        let mut r = built("http://127.0.0.1:9000/", Addressing::Path, &OriginRequest::default());
        s.sign(&mut r, example_time()).unwrap();
        let before = r.headers()["authorization"].clone();
        s.set_credentials(Arc::new(S3Credentials {
            access_key_id: "AKIDNEW".into(),
            secret_access_key: Secret("new".into()),
            session_token: None,
            source: "test".into(),
        }));
        assert_eq!(s.key_in_use().0, "AKIDNEW");
        let mut r = built("http://127.0.0.1:9000/", Addressing::Path, &OriginRequest::default());
        s.sign(&mut r, example_time()).unwrap();
        assert_ne!(r.headers()["authorization"], before);
        assert!(r.headers()["authorization"].to_str().unwrap().contains("Credential=AKIDNEW/"));
    }

    #[test]
    fn error_codes_are_read_from_s3_error_bodies() {
        let body = b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SignatureDoesNotMatch</Code>\
                     <Message>The request signature we calculated does not match</Message></Error>";
        assert_eq!(error_code(body), Some("SignatureDoesNotMatch"));
        assert_eq!(error_code(b"<Error><Code>InvalidAccessKeyId</Code></Error>"), Some("InvalidAccessKeyId"));
        assert_eq!(error_code(b"forbidden"), None);
        assert_eq!(error_code(b"<Code><script></Code>"), None);
        assert_eq!(error_code(b"<Code>"), None);
    }
}
