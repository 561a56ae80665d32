/**
 * The vsnap package version (written into every manifest).
 * @public
 */
export const VERSION = '0.1.0';
