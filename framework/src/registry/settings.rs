//! How the registry client is configured: the config's options, with the
//! environment filling in what they leave unset, and the defaults.

use std::fmt;
use std::time::Duration;

#[cfg(doc)]
use super::RegistryClient;
use crate::config::{redact_url, KafkaConfig, RegistryAuth, RegistryOptions, Secret};
use crate::error::{Error, Result};

/// Connect timeout used when neither the config nor the environment sets one.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Request timeout used when neither the config nor the environment sets one.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

pub(super) const ENV_USER: &str = "KJOB_SCHEMA_REGISTRY_USER";
pub(super) const ENV_PASSWORD: &str = "KJOB_SCHEMA_REGISTRY_PASSWORD";
pub(super) const ENV_TOKEN: &str = "KJOB_SCHEMA_REGISTRY_TOKEN";
pub(super) const ENV_CONNECT_TIMEOUT: &str = "KJOB_SCHEMA_REGISTRY_CONNECT_TIMEOUT_MS";
pub(super) const ENV_TIMEOUT: &str = "KJOB_SCHEMA_REGISTRY_TIMEOUT_MS";

/// The settings a [`RegistryClient`] is built with, fully resolved.
/// `Debug` redacts credentials, including any `user:password@` in the URL.
#[derive(Clone)]
pub struct RegistrySettings {
    /// Base URL of a Confluent-compatible API (no trailing slash).
    pub url: String,
    /// TCP (and TLS) connect timeout.
    pub connect_timeout: Duration,
    /// Timeout for a whole request.
    pub request_timeout: Duration,
    /// Credentials, if any.
    pub auth: Option<RegistryAuth>,
}

impl fmt::Debug for RegistrySettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistrySettings")
            .field("url", &redact_url(&self.url))
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("auth", &self.auth)
            .finish()
    }
}

impl RegistrySettings {
    /// The config's registry options, with the environment filling in what
    /// they leave unset. Fails on an environment value kjob cannot use
    /// (a timeout that is not a number, a user without a password, both a
    /// user and a token), naming the variable.
    pub fn resolve(config: &KafkaConfig) -> Result<Self> {
        Self::resolve_with(&config.schema_registry_url, &config.registry, |k| {
            std::env::var(k).ok().filter(|v| !v.trim().is_empty())
        })
    }

    /// Settings for `url` from the environment alone.
    pub fn from_env(url: &str) -> Result<Self> {
        Self::resolve_with(url, &RegistryOptions::default(), |k| {
            std::env::var(k).ok().filter(|v| !v.trim().is_empty())
        })
    }

    pub(super) fn resolve_with(
        url: &str,
        options: &RegistryOptions,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self> {
        let millis = |name: &str| -> Result<Option<Duration>> {
            let Some(raw) = env(name) else {
                return Ok(None);
            };
            match raw.trim().parse::<u64>() {
                Ok(ms) if ms > 0 => Ok(Some(Duration::from_millis(ms))),
                _ => Err(Error::InvalidSetting {
                    name: name.to_string(),
                    value: raw,
                    reason: "milliseconds, a whole number above 0 (e.g. 5000)".into(),
                }),
            }
        };
        let connect_timeout = match options.connect_timeout {
            Some(d) => d,
            None => millis(ENV_CONNECT_TIMEOUT)?.unwrap_or(DEFAULT_CONNECT_TIMEOUT),
        };
        let request_timeout = match options.request_timeout {
            Some(d) => d,
            None => millis(ENV_TIMEOUT)?.unwrap_or(DEFAULT_REQUEST_TIMEOUT),
        };
        for (name, d) in [
            ("registry connect timeout", connect_timeout),
            ("registry request timeout", request_timeout),
        ] {
            if d.is_zero() {
                return Err(Error::InvalidSetting {
                    name: name.into(),
                    value: format!("{d:?}"),
                    reason: "a zero timeout fails every call; use a positive duration".into(),
                });
            }
        }
        let auth = match &options.auth {
            Some(a) => Some(a.clone()),
            None => match (env(ENV_USER), env(ENV_PASSWORD), env(ENV_TOKEN)) {
                (None, None, None) => None,
                (Some(_), _, Some(_)) | (None, Some(_), Some(_)) => {
                    return Err(Error::InvalidSetting {
                        name: ENV_TOKEN.into(),
                        value: "***".into(),
                        reason: format!("set either {ENV_USER}/{ENV_PASSWORD} (basic auth) or {ENV_TOKEN} (bearer), not both"),
                    })
                }
                (Some(user), Some(password), None) => Some(RegistryAuth::Basic {
                    user,
                    password: Secret::new(password),
                }),
                (Some(user), None, None) => {
                    return Err(Error::InvalidSetting {
                        name: ENV_PASSWORD.into(),
                        value: "(unset)".into(),
                        reason: format!("{ENV_USER} is set to `{user}`; set its password (the API secret) too"),
                    })
                }
                (None, Some(_), None) => {
                    return Err(Error::InvalidSetting {
                        name: ENV_USER.into(),
                        value: "(unset)".into(),
                        reason: format!("{ENV_PASSWORD} is set; set the user (the API key) too"),
                    })
                }
                (None, None, Some(token)) => Some(RegistryAuth::Bearer(Secret::new(token))),
            },
        };
        Ok(Self {
            url: url.trim_end_matches('/').to_string(),
            connect_timeout,
            request_timeout,
            auth,
        })
    }
}
