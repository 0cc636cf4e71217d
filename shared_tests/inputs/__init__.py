"""Every input a user can pass: accepted ones give the same numbers, refused ones the same clear
error, in every backend; and torch's thread count."""
