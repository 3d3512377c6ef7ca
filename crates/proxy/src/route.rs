//! Routes: a path pattern and methods select a route; the route names the resource a
//! write touches and the policy that applies to it.
//!
//! A pattern is `/`-separated segments, each a literal (`orders`), a parameter that
//! takes one whole segment (`{id}`), or, last only, a rest parameter that takes the
//! remaining segments with their slashes (`{*path}`). Literals and parameters are
//! matched against percent-decoded segments, so `/orders/%31` is `/orders/1`.
//! A resource template is text with `{name}` parameters of its route's pattern; the
//! resource key is the template with each parameter replaced by its decoded value.
//!
//! Requests are matched on the normalized path ([`normalize`]): `.` and `..` segments
//! resolved (also percent-encoded ones) and empty segments dropped, as most upstreams
//! and frameworks resolve them, so that no spelling of a fenced path reaches the
//! upstream by another route. The normalized path is what the upstream receives. What
//! upstreams disagree on (encoded slashes and backslashes, backslashes, `;` path
//! parameters, encoded NULs) is refused rather than guessed at.

use std::borrow::Cow;
use std::fmt;

use http::Method;
use percent_encoding::percent_decode_str;

/// What a route does with the writes it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// A write needs a current token (428 without, 400 malformed, 409 stale).
    Fenced,
    /// A write goes through; one without a current token is recorded as unprotected.
    Advisory,
    /// Nothing is checked.
    Open,
}

impl Policy {
    /// Parses `fenced`, `advisory` or `open`.
    pub fn parse(text: &str) -> Option<Policy> {
        match text {
            "fenced" => Some(Policy::Fenced),
            "advisory" => Some(Policy::Advisory),
            "open" => Some(Policy::Open),
            _ => None,
        }
    }

    /// The policy's name, as in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Fenced => "fenced",
            Policy::Advisory => "advisory",
            Policy::Open => "open",
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The methods that never write (RFC 9110 §9.2.1), which pass a fenced route unchecked.
pub const SAFE_METHODS: [Method; 4] = [Method::GET, Method::HEAD, Method::OPTIONS, Method::TRACE];

/// The methods a route checks when its config names none: the write methods.
pub const DEFAULT_METHODS: [Method; 4] = [Method::POST, Method::PUT, Method::PATCH, Method::DELETE];

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Param(String),
    Rest(String),
}

/// A path pattern (`/orders/{id}`, `/files/{*path}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPattern {
    text: String,
    segments: Vec<Segment>,
}

/// Why a pattern or a template does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PatternError(String);

impl PathPattern {
    /// Parses a pattern: it starts with `/`; a segment is a literal, `{name}` or, last,
    /// `{*name}`; names are ASCII letters, digits and `_`, each used once.
    ///
    /// # Errors
    ///
    /// [`PatternError`] naming the segment at fault.
    pub fn parse(text: &str) -> Result<PathPattern, PatternError> {
        let Some(rest) = text.strip_prefix('/') else {
            return Err(PatternError(format!("`{text}` must start with /")));
        };
        let parts: Vec<&str> = if rest.is_empty() {
            Vec::new()
        } else {
            rest.split('/').collect()
        };
        let mut segments = Vec::with_capacity(parts.len());
        let mut names: Vec<&str> = Vec::new();
        for (i, part) in parts.iter().enumerate() {
            let segment = if let Some(inner) =
                part.strip_prefix('{').and_then(|p| p.strip_suffix('}'))
            {
                let (rest_param, name) = match inner.strip_prefix('*') {
                    Some(name) => (true, name),
                    None => (false, inner),
                };
                if !valid_name(name) {
                    return Err(PatternError(format!(
                        "`{part}` in `{text}`: a parameter name is ASCII letters, digits and _"
                    )));
                }
                if names.contains(&name) {
                    return Err(PatternError(format!(
                        "`{{{name}}}` appears twice in `{text}`"
                    )));
                }
                names.push(name);
                if rest_param {
                    if i + 1 != parts.len() {
                        return Err(PatternError(format!(
                            "`{part}` in `{text}`: a rest parameter must be the last segment"
                        )));
                    }
                    Segment::Rest(name.to_owned())
                } else {
                    Segment::Param(name.to_owned())
                }
            } else if part.contains(['{', '}']) {
                return Err(PatternError(format!(
                    "`{part}` in `{text}`: a parameter is a whole segment, `{{name}}`"
                )));
            } else if let Some(what) = ambiguous(part) {
                return Err(PatternError(format!(
                    "`{part}` in `{text}` holds {what}: requests holding it are refused, so the route could never match"
                )));
            } else if part.is_empty() || matches!(decode(part).as_ref(), "." | "..") {
                return Err(PatternError(format!(
                    "`{text}` has an empty, `.` or `..` segment; requests are matched on normalized paths"
                )));
            } else {
                Segment::Literal(decode(part).into_owned())
            };
            segments.push(segment);
        }
        Ok(PathPattern {
            text: text.to_owned(),
            segments,
        })
    }

    /// The pattern as written (the metrics' `route` label).
    pub fn as_str(&self) -> &str {
        &self.text
    }

    fn params(&self) -> impl Iterator<Item = &str> {
        self.segments.iter().filter_map(|s| match s {
            Segment::Param(n) | Segment::Rest(n) => Some(n.as_str()),
            Segment::Literal(_) => None,
        })
    }

    /// The decoded parameter values when the normalized `path` matches, by name.
    fn matches<'p>(&self, path: &'p str) -> Option<Vec<(&str, Cow<'p, str>)>> {
        let mut parts = path.strip_prefix('/')?.split('/').filter(|p| !p.is_empty());
        let mut values = Vec::new();
        for segment in &self.segments {
            match segment {
                Segment::Literal(lit) => {
                    if decode(parts.next()?) != lit.as_str() {
                        return None;
                    }
                }
                Segment::Param(name) => values.push((name.as_str(), decode(parts.next()?))),
                Segment::Rest(name) => {
                    let rest: Vec<Cow<'p, str>> = parts.by_ref().map(decode).collect();
                    if rest.is_empty() {
                        return None;
                    }
                    values.push((name.as_str(), Cow::Owned(rest.join("/"))));
                }
            }
        }
        parts.next().is_none().then_some(values)
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

fn decode(text: &str) -> Cow<'_, str> {
    percent_decode_str(text).decode_utf8_lossy()
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Param(String),
}

/// A resource template (`orders/{id}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceTemplate {
    parts: Vec<Part>,
}

impl ResourceTemplate {
    /// Parses a template whose parameters must all be parameters of `pattern`.
    ///
    /// # Errors
    ///
    /// [`PatternError`] for an empty template, an unclosed or empty `{`, or a parameter
    /// the pattern does not have.
    pub fn parse(text: &str, pattern: &PathPattern) -> Result<ResourceTemplate, PatternError> {
        if text.is_empty() {
            return Err(PatternError("the resource is empty".into()));
        }
        let mut parts = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                parts.push(Part::Text(rest[..open].to_owned()));
            }
            let Some(close) = rest[open..].find('}') else {
                return Err(PatternError(format!("`{text}` has a `{{` without `}}`")));
            };
            let name = &rest[open + 1..open + close];
            if !pattern.params().any(|p| p == name) {
                return Err(PatternError(format!(
                    "`{{{name}}}` in `{text}` is not a parameter of the path `{}`",
                    pattern.as_str()
                )));
            }
            parts.push(Part::Param(name.to_owned()));
            rest = &rest[open + close + 1..];
        }
        if rest.contains('}') {
            return Err(PatternError(format!("`{text}` has a `}}` without `{{`")));
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_owned()));
        }
        Ok(ResourceTemplate { parts })
    }

    fn render(&self, values: &[(&str, Cow<'_, str>)]) -> String {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(t) => out.push_str(t),
                Part::Param(name) => {
                    if let Some((_, v)) = values.iter().find(|(n, _)| n == name) {
                        out.push_str(v);
                    }
                }
            }
        }
        out
    }
}

/// One route: which requests, which resource, which policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The path pattern; `None` for the default route, which matches every path.
    pub pattern: Option<PathPattern>,
    /// The methods checked; other methods pass unchecked.
    pub methods: Vec<Method>,
    /// The resource key template; `None`: the decoded path (as `FenceLayer` names it).
    pub resource: Option<ResourceTemplate>,
    /// The policy.
    pub policy: Policy,
}

impl Route {
    /// The metrics label: the pattern, or `default`.
    pub fn label(&self) -> &str {
        self.pattern.as_ref().map_or("default", PathPattern::as_str)
    }

    /// The resource key of a request to the normalized `path`, if the route matches it.
    ///
    /// Without a template the key is the decoded path without a trailing slash
    /// (`/orders/1/` is `/orders/1`, as most upstreams route it), `/` for the root.
    pub fn resource_of(&self, path: &str) -> Option<String> {
        let path_key = || {
            let trimmed = path.trim_end_matches('/');
            decode(if trimmed.is_empty() { "/" } else { trimmed }).into_owned()
        };
        match &self.pattern {
            None => Some(path_key()),
            Some(pattern) => {
                let values = pattern.matches(path)?;
                Some(match &self.resource {
                    Some(template) => template.render(&values),
                    None => path_key(),
                })
            }
        }
    }

    /// Whether `method` is refused on this route: on a fenced route, a method that is
    /// neither checked (in `methods`) nor safe (`GET`, `HEAD`, `OPTIONS`, `TRACE`).
    /// A lower-case `put` or a WebDAV `MOVE` would otherwise reach an upstream that
    /// treats it as a write, unchecked.
    pub fn refuses(&self, method: &Method) -> bool {
        self.policy == Policy::Fenced
            && !self.methods.contains(method)
            && !SAFE_METHODS.contains(method)
    }

    /// Whether the route matches the normalized `path`.
    pub fn matches(&self, path: &str) -> bool {
        self.pattern
            .as_ref()
            .is_none_or(|p| p.matches(path).is_some())
    }

    /// Whether a request with `method` is checked (the policy is not open and the method
    /// is one of the route's).
    pub fn checks(&self, method: &Method) -> bool {
        self.policy != Policy::Open && self.methods.contains(method)
    }
}

/// The routes in order, then the default route: the first that matches a path serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteTable {
    routes: Vec<Route>,
}

impl RouteTable {
    /// `routes` in match order, and the default route's policy (every path, the default
    /// methods, the decoded path as resource).
    pub fn new(mut routes: Vec<Route>, default: Policy) -> RouteTable {
        routes.push(Route {
            pattern: None,
            methods: DEFAULT_METHODS.to_vec(),
            resource: None,
            policy: default,
        });
        RouteTable { routes }
    }

    /// The routes, the default last.
    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// The index of the route serving the normalized `path` (the default when none
    /// other matches).
    pub fn find(&self, path: &str) -> usize {
        self.routes
            .iter()
            .position(|r| r.matches(path))
            .unwrap_or(self.routes.len() - 1)
    }
}

/// Why a request path is refused before any route sees it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// `..` segments climb above `/`.
    #[error("the path climbs above / with `..`")]
    AboveRoot,
    /// The path is not absolute (`*`, or an authority-form target).
    #[error("the request target is not an absolute path")]
    NotAbsolute,
    /// The path holds what upstreams read in different ways: an encoded slash or
    /// backslash (`%2F`, `%5C`), a backslash, a `;` (path parameters, which some
    /// servers strip before routing) or an encoded NUL. Refused, so that the proxy and
    /// the upstream never route one request to two places.
    #[error("the path holds {0}, which upstreams route in different ways")]
    Ambiguous(&'static str),
}

/// The normalized form of an absolute `path`: empty and `.` segments dropped, `..`
/// segments resolved (each also when percent-encoded, `%2e`), a trailing slash kept.
/// A path the upstream could route elsewhere than the proxy is refused
/// ([`PathError::Ambiguous`]).
/// `Cow::Borrowed` when the path is already normal.
///
/// # Errors
///
/// [`PathError`] for a path that is not absolute or climbs above `/`.
pub fn normalize(path: &str) -> Result<Cow<'_, str>, PathError> {
    let Some(rest) = path.strip_prefix('/') else {
        return Err(PathError::NotAbsolute);
    };
    if let Some(what) = ambiguous(path) {
        return Err(PathError::Ambiguous(what));
    }
    let dotted = |s: &str| {
        let d = decode(s);
        d == "." || d == ".."
    };
    if !rest
        .split('/')
        .enumerate()
        .any(|(i, s)| (s.is_empty() && i + 1 != rest.split('/').count()) || dotted(s))
    {
        return Ok(Cow::Borrowed(path));
    }
    let mut kept: Vec<&str> = Vec::new();
    let parts: Vec<&str> = rest.split('/').collect();
    let mut trailing = false;
    for (i, s) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        match decode(s).as_ref() {
            "" => trailing = last,
            "." => trailing = last,
            ".." => {
                if kept.pop().is_none() {
                    return Err(PathError::AboveRoot);
                }
                trailing = last;
            }
            _ => {
                kept.push(s);
                trailing = false;
            }
        }
    }
    let mut out = String::with_capacity(path.len());
    for s in &kept {
        out.push('/');
        out.push_str(s);
    }
    if out.is_empty() || trailing {
        out.push('/');
    }
    Ok(Cow::Owned(out))
}

/// What in `path` upstreams disagree on, if anything.
fn ambiguous(path: &str) -> Option<&'static str> {
    if path.contains('\\') {
        return Some("a backslash");
    }
    if path.contains(';') {
        return Some("a `;` (path parameters)");
    }
    // Bytes, not `str` slices: a `%` may be followed by a multi-byte character.
    let bytes = path.as_bytes();
    for (i, b) in bytes.iter().enumerate() {
        if *b == b'%' && i + 2 < bytes.len() {
            match &bytes[i + 1..i + 3] {
                b"2f" | b"2F" => return Some("an encoded slash (%2F)"),
                b"5c" | b"5C" => return Some("an encoded backslash (%5C)"),
                b"00" => return Some("an encoded NUL (%00)"),
                _ => {}
            }
        }
    }
    None
}

#[cfg(test)]
mod tests;
