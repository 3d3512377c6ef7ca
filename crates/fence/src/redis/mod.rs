//! The fence on Redis: a Redis Function library that checks a token and writes in one
//! atomic call.
